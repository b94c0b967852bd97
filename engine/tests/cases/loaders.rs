//! The dev-set loaders on `../shared/evaldata`.

use scd_engine::eval::{load, Dataset};

use super::evaldata;

fn check(dataset: Dataset, rel: &str) {
    let Some(path) = evaldata(rel) else { return };
    let examples = load(dataset, &path, 20).unwrap();
    assert_eq!(examples.len(), 20, "{rel}");
    for ex in &examples {
        assert!(!ex.question.is_empty() && !ex.context.fields.is_empty(), "{rel} {}", ex.id);
        ex.context.validate().unwrap();
        for &(f, (a, b)) in &ex.gold {
            let content = &ex.context.fields[f].content;
            assert!(a < b && b <= content.len() && content.is_char_boundary(a) && content.is_char_boundary(b));
        }
    }
    let with_gold = examples.iter().filter(|e| !e.gold.is_empty()).count();
    assert!(with_gold >= 18, "{rel}: only {with_gold}/20 examples have gold evidence");
}

#[test]
fn hotpotqa_official_layout() {
    check(Dataset::HotpotQa, "hotpotqa/hotpot_original_schema.json");
}

#[test]
fn hotpotqa_hugging_face_layout() {
    check(Dataset::HotpotQa, "hotpotqa/hotpot_hf_schema.jsonl");
}

#[test]
fn squad_v2() {
    check(Dataset::Squad, "squad_v2/squad_v2_dev_subset.json");
}

#[test]
fn musique() {
    check(Dataset::Musique, "musique/musique_ans_sample.jsonl");
}

#[test]
fn two_wiki() {
    check(Dataset::TwoWiki, "2wikimultihopqa/2wiki_sample.json");
}

#[test]
fn unknown_dataset_and_bad_file_are_clear_errors() {
    assert_eq!(
        "nq".parse::<Dataset>().unwrap_err().to_string(),
        "dataset: \"nq\": expected hotpotqa, squad, musique, 2wiki or code"
    );
    let tmp = std::env::temp_dir().join("scd_bad_eval.json");
    std::fs::write(&tmp, "not json").unwrap();
    let err = load(Dataset::Squad, &tmp, 5).unwrap_err().to_string();
    assert!(err.contains("scd_bad_eval.json") && err.contains("not JSON"), "{err}");
}
