//! Code contexts: a function is sent whole or not at all (never a prefix)
//! whatever the budget, on Rust and Python fixture files.

use std::sync::Arc;

use scd_engine::context::{Context, ContextRequirement, Field, FieldKind, Task};
use scd_engine::encoder::{Encoder, HashEncoder};
use scd_engine::extract::{CompressRequest, Scd, ScdConfig};

/// (doc sentence, byte span of the function without its doc) for each
/// documented function of a fixture.
fn functions(src: &str, python: bool) -> Vec<(String, (usize, usize))> {
    let mut lines = Vec::new();
    let mut pos = 0;
    for l in src.split_inclusive('\n') {
        lines.push((pos, l.trim_end()));
        pos += l.len();
    }
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (i, &(start, line)) in lines.iter().enumerate() {
        let t = line.trim_start();
        let (doc, def) = if python {
            if !t.starts_with("def ") {
                continue;
            }
            (lines[i + 1].1.trim().trim_matches('"').to_string(), i)
        } else {
            if !t.starts_with("///") {
                continue;
            }
            let Some(d) = (i + 1..lines.len()).find(|&j| !lines[j].1.trim_start().starts_with("#[")) else {
                continue;
            };
            if !lines[d].1.contains("fn ") {
                continue;
            }
            (t.trim_start_matches('/').trim().to_string(), d)
        };
        let _ = start;
        let ind = indent(lines[def].1);
        let end = if python {
            (def + 1..lines.len())
                .find(|&j| !lines[j].1.trim().is_empty() && indent(lines[j].1) <= ind)
                .map_or(lines.len() - 1, |j| j - 1)
        } else {
            (def + 1..lines.len()).find(|&j| lines[j].1 == format!("{}}}", " ".repeat(ind))).unwrap()
        };
        let end = (def..=end).rev().find(|&j| !lines[j].1.trim().is_empty()).unwrap();
        out.push((doc, (lines[def].0 + ind, lines[end].0 + lines[end].1.len())));
    }
    out
}

#[test]
fn functions_are_sent_whole_or_not_at_all() {
    let enc = Arc::new(HashEncoder::new(256, 512));
    let scd = Scd::new(enc.clone(), ScdConfig::default());
    for (name, python) in [("ledger.rs", false), ("ledger.py", true)] {
        let src = std::fs::read_to_string(format!("{}/../fixtures/code/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let fns = functions(&src, python);
        assert!(fns.len() >= 7, "{name}: {} functions found", fns.len());
        let mut whole = 0;
        let mut runs = 0;
        for (doc, (a, b)) in &fns {
            let tokens = enc.count_tokens(&src[*a..*b]).unwrap();
            for budget in [tokens, tokens + 16, 2 * tokens, 4 * tokens] {
                let out = scd
                    .compress(&CompressRequest {
                        task: Task::new(doc.clone()),
                        context: Context {
                            fields: vec![Field {
                                name: format!("src/{name}"),
                                kind: FieldKind::Code,
                                content: src.clone(),
                                confidential: false,
                            }],
                        },
                        requirement: ContextRequirement::with_budget(budget),
                        session: None,
                    })
                    .unwrap();
                // each non-empty line of the function: inside a sent span or not
                let mut p = *a;
                let mut sent = Vec::new();
                for l in src[*a..*b].split('\n') {
                    if !l.trim().is_empty() {
                        let s = p + (l.len() - l.trim_start().len());
                        sent.push(out.chunks.iter().any(|c| c.span.0 <= s && s < c.span.1));
                    }
                    p += l.len() + 1;
                }
                assert!(
                    sent.iter().all(|&x| x) || sent.iter().all(|&x| !x),
                    "{name}: {doc:?} at budget {budget} ({tokens} tokens): lines sent {sent:?}"
                );
                runs += 1;
                whole += usize::from(sent.iter().all(|&x| x));
            }
        }
        // not vacuous: the function asked for is sent whole in most runs
        assert!(whole * 2 > runs, "{name}: whole in {whole} of {runs} runs");
    }
}
