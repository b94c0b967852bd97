//! What the agent evaluations share: a case's size and the order of the
//! kinds in their reports ([`super::eval_agent`], [`super::eval_agent_more`]).

use scd_engine::eval::agent::AgentCase;

/// The tokens of `case`'s context: every field's whole text, counted by `count`.
pub(super) fn case_tokens(
    case: &AgentCase,
    count: &dyn Fn(&str) -> scd_engine::Result<usize>,
) -> scd_engine::Result<usize> {
    case.example.context.fields.iter().map(|f| count(&f.content)).sum()
}

/// The distinct `kinds` in order of first appearance, then `all`.
pub(super) fn kinds_then_all<'a>(kinds: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for k in kinds {
        if !out.contains(&k) {
            out.push(k);
        }
    }
    out.push("all");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn kinds_come_once_in_order_of_first_appearance_then_all() {
        assert_eq!(super::kinds_then_all(["logs", "docs", "logs", "json", "docs"]), ["logs", "docs", "json", "all"]);
        assert_eq!(super::kinds_then_all([]), ["all"]);
    }
}
