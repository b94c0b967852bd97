"""Tests of the reranker this project trains (models/rerank/): its committed
weights match their checksum, the built ONNX graph reproduces the JAX
reference, the pair layout cuts where it says, and the training pairs'
doc-comment reader takes what it should.

    .tools/venv/bin/python -m unittest discover -s models -p 'test_*.py'
"""

import hashlib
import json
import sys
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE / "rerank")]
import build_onnx  # noqa: E402
import build_pairs  # noqa: E402
from pairs import Inputs  # noqa: E402

BUILT = HERE / "out" / "rerank"


def tokenizer() -> Inputs:
    path = BUILT / "tokenizer.json"
    if not path.exists():
        raise AssertionError(f"{path} is missing: run models/setup.sh (the test command does)")
    return Inputs(path.read_bytes())


class Weights(unittest.TestCase):
    def test_the_committed_weights_match_their_checksum(self):
        want = (HERE / "rerank" / "weights.sha256").read_text().split()
        got = hashlib.sha256((HERE / "rerank" / "weights.safetensors").read_bytes()).hexdigest()
        self.assertEqual(want, [got, "weights.safetensors"])

    def test_the_weights_stay_within_the_size_limit(self):
        self.assertLessEqual((HERE / "rerank" / "weights.safetensors").stat().st_size, 30 * 1024 * 1024)

    def test_the_built_graph_is_from_these_weights_and_reproduces_the_jax_reference(self):
        manifest = json.loads((BUILT / "manifest.json").read_text())
        want = (HERE / "rerank" / "weights.sha256").read_text().split()[0]
        self.assertEqual(manifest["weights_sha256"], want)
        ref = json.loads((HERE / "rerank" / "reference.json").read_text())
        self.assertGreaterEqual(len(ref["pairs"]), 10)
        self.assertLessEqual(build_onnx.check(BUILT), build_onnx.TOLERANCE)


class Layout(unittest.TestCase):
    def test_a_pair_is_cls_query_sep_passage_sep_with_types(self):
        t = tokenizer()
        ids, types = t.ids("why", "because it broke")
        self.assertEqual(ids[0], t.cls)
        self.assertEqual(ids.count(t.sep), 2)
        q_end = ids.index(t.sep)
        self.assertEqual(types[: q_end + 1], [0] * (q_end + 1))
        self.assertEqual(types[q_end + 1:], [1] * (len(ids) - q_end - 1))

    def test_long_inputs_are_cut_query_first_to_its_share(self):
        t = tokenizer()
        ids, types = t.ids("word " * 200, "other " * 500, max_tokens=256)
        self.assertEqual(len(ids), 256)
        self.assertEqual(types.count(0), 64 + 2)
        ids, _ = t.ids("short question", "other " * 500, max_tokens=256)
        self.assertEqual(len(ids), 256)
        self.assertEqual(ids[-1], t.sep)


RUST = '''use std::io;

/// Opens the [`Store`](crate::Store) at `path`, creating it when missing.
///
/// # Errors
/// When the folder cannot be read.
#[inline]
pub fn open(path: &str) -> io::Result<Store> {
    let s = Store::new(path);
    s.check()?;
    Ok(s)
}

fn undocumented() -> u8 {
    1
}

/// Too short.
pub fn tiny() -> u8 { 2 }
'''


class DocPairs(unittest.TestCase):
    def test_a_documented_function_gives_its_first_sentence_and_its_text(self):
        fns = build_pairs.functions("demo-0.1.0/src/lib.rs", RUST)
        self.assertEqual([f["task"] for f in fns], ["Opens the Store at path, creating it when missing"])
        self.assertTrue(fns[0]["text"].startswith("pub fn open(path: &str)"))
        self.assertTrue(fns[0]["text"].endswith("}"))
        self.assertNotIn("///", fns[0]["text"])

    def test_the_held_out_projects_and_the_dev_crates_are_never_sources(self):
        self.assertIn("globset", build_pairs.HELD_OUT_CRATES)
        self.assertIn("ignore", build_pairs.HELD_OUT_CRATES)
        crates = json.loads((HERE / "rerank" / "data_summary.json").read_text())["crates"]
        names = {c.rsplit("-", 1)[0] for c in crates}
        self.assertGreater(len(names), 50)
        self.assertFalse(names & build_pairs.HELD_OUT_CRATES)
        self.assertTrue(all(n[0] <= "l" for n in names))


if __name__ == "__main__":
    unittest.main()
