//! The schemas `tools/list` shows: lean, because an MCP client puts every
//! tool's description and schemas in the model's window each session, before
//! its first call (docs/protocols.md: at most 1,000 cl100k tokens in all,
//! measured with the official Python client).
//!
//! - **Input** ([`input`]): the argument types' schema with each description
//!   cut to its first paragraph (a doc comment's summary; the rest stays in
//!   rustdoc and in the REST API's OpenAPI document, which share these
//!   types), `T | null` written `T` (an optional argument is left out, not
//!   sent as null), one-use `$defs` inlined, enums of constants as `enum`,
//!   and `$schema`, `title`, `format` and zero defaults (`false`, `[]`,
//!   `""`) dropped. Names, types, `required`, bounds and
//!   `additionalProperties: false` stay: the server still parses arguments
//!   strictly and names the one at fault.
//! - **Output** ([`output`]): an object with the keys every result has
//!   (`required`). A structured result matches it (the Python client checks);
//!   the keys' types, the optional ones (`explanation`) and what each holds
//!   are docs/protocols.md's to say: a full output schema cost more than all
//!   the rest together, and a model reads the result itself.
//!
//! ```
//! use scd_service::mcp::{schema, CountTokensArgs, TokensOutput};
//!
//! let input = serde_json::Value::Object((*schema::input::<CountTokensArgs>()).clone());
//! assert_eq!(input["properties"]["text"]["type"], "string");
//! assert!(input.get("$schema").is_none());
//! let output = serde_json::Value::Object((*schema::output::<TokensOutput>()).clone());
//! assert_eq!(output, serde_json::json!({"type": "object", "required": ["tokens", "tokenizer"]}));
//! ```

use std::sync::Arc;

use rmcp::model::JsonObject;
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// The lean input schema of the arguments `T` (see the module docs).
///
/// # Panics
/// When `T`'s schema is no object schema (a programming error, caught by
/// the tests that list the tools).
pub fn input<T: JsonSchema + std::any::Any>() -> Arc<JsonObject> {
    let full = rmcp::handler::server::common::schema_for_input::<T>()
        .unwrap_or_else(|e| panic!("input schema of {}: {e}", std::any::type_name::<T>()));
    let mut root = (*full).clone();
    let defs = match root.remove("$defs") {
        Some(Value::Object(defs)) => defs,
        _ => Map::new(),
    };
    root.remove("$schema");
    match lean(Value::Object(root), &defs) {
        Value::Object(o) => Arc::new(o),
        other => panic!("input schema of {}: not an object: {other}", std::any::type_name::<T>()),
    }
}

/// The output schema of the result `T`: an object with the keys every
/// result has (see the module docs).
///
/// # Panics
/// When `T`'s schema is no object schema.
pub fn output<T: JsonSchema + std::any::Any>() -> Arc<JsonObject> {
    let full = rmcp::handler::server::common::schema_for_output::<T>();
    assert_eq!(full.get("type"), Some(&Value::from("object")), "output schema of {}", std::any::type_name::<T>());
    let mut out = JsonObject::new();
    out.insert("type".into(), "object".into());
    if let Some(required) = full.get("required") {
        out.insert("required".into(), required.clone());
    }
    Arc::new(out)
}

/// The definition a `#/$defs/NAME` reference names.
fn def<'a>(reference: &str, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    defs.get(reference.strip_prefix("#/$defs/")?)
}

/// Whether a schema admits only null.
fn is_null(schema: &Value) -> bool {
    schema.get("type") == Some(&Value::from("null"))
}

/// `["T", "null"]` as `"T"`; any other type as it is.
fn non_null(ty: Value) -> Value {
    match ty {
        Value::Array(types) => {
            let mut rest: Vec<Value> = types.into_iter().filter(|t| t != "null").collect();
            if rest.len() == 1 {
                rest.remove(0)
            } else {
                Value::Array(rest)
            }
        }
        ty => ty,
    }
}

/// A description's first paragraph on one line.
fn summary(text: &str) -> String {
    let first = text.split("\n\n").next().unwrap_or_default();
    first.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `schema` made lean, recursively (see the module docs).
fn lean(schema: Value, defs: &Map<String, Value>) -> Value {
    let Value::Object(mut o) = schema else { return schema };
    // a reference, or `anyOf: [X, null]`: the target with this schema's own keys over it
    let target = match (o.get("$ref"), o.get("anyOf")) {
        (Some(Value::String(r)), _) => def(r, defs).cloned(),
        (_, Some(Value::Array(branches))) => match branches.iter().filter(|b| !is_null(b)).collect::<Vec<_>>()[..] {
            [only] => Some(only.clone()),
            _ => None,
        },
        _ => None,
    };
    if target.is_some() {
        o.remove("$ref");
        o.remove("anyOf");
    }
    if let Some(Value::Object(t)) = target.map(|t| lean(t, defs)) {
        for (k, v) in t {
            o.entry(k).or_insert(v);
        }
    }
    // an enum of documented constants: the constants
    if let Some(Value::Array(variants)) = o.get("oneOf") {
        let consts: Option<Vec<Value>> = variants.iter().map(|v| v.get("const").cloned()).collect();
        if let Some(consts) = consts {
            o.remove("oneOf");
            o.insert("type".into(), "string".into());
            o.insert("enum".into(), Value::Array(consts));
        }
    }
    for key in ["$schema", "title", "format"] {
        o.remove(key);
    }
    if o.get("default").is_some_and(|d| matches!(d, Value::Bool(false)) || d == "" || d == &Value::Array(vec![])) {
        o.remove("default");
    }
    if let Some(ty) = o.remove("type") {
        o.insert("type".into(), non_null(ty));
    }
    if let Some(Value::String(d)) = o.get("description") {
        let short = summary(d);
        o.insert("description".into(), Value::String(short));
    }
    for key in ["properties", "items"] {
        match o.remove(key) {
            Some(Value::Object(props)) if key == "properties" => {
                let props = props.into_iter().map(|(k, v)| (k, lean(v, defs))).collect();
                o.insert(key.into(), Value::Object(props));
            }
            Some(v) => {
                o.insert(key.into(), lean(v, defs));
            }
            None => {}
        }
    }
    Value::Object(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_schemas_keep_names_types_bounds_and_strictness_and_lose_the_rest() {
        let defs = json!({
            "Kind": {"description": "A kind.", "oneOf": [
                {"const": "a", "type": "string", "description": "The first."},
                {"const": "b", "type": "string"}
            ]},
            "Inner": {"type": "object", "description": "Inner thing.", "additionalProperties": false,
                      "properties": {"x": {"type": "integer", "format": "uint32", "minimum": 1}}}
        });
        let Value::Object(defs) = defs else { unreachable!() };
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object", "additionalProperties": false, "required": ["inner"],
            "properties": {
                "inner": {"$ref": "#/$defs/Inner", "description": "Its own words.\n\nMore words, for people."},
                "kind": {"anyOf": [{"$ref": "#/$defs/Kind"}, {"type": "null"}]},
                "flag": {"type": "boolean", "default": false, "description": "A\nflag."},
                "list": {"type": "array", "default": [], "items": {"type": "string"}},
                "start": {"type": "string", "default": "prose"},
                "limit": {"type": ["integer", "null"], "format": "uint64", "minimum": 1}
            }
        });
        assert_eq!(
            lean(schema, &defs),
            json!({
                "type": "object", "additionalProperties": false, "required": ["inner"],
                "properties": {
                    "inner": {"type": "object", "description": "Its own words.", "additionalProperties": false,
                              "properties": {"x": {"type": "integer", "minimum": 1}}},
                    "kind": {"type": "string", "enum": ["a", "b"], "description": "A kind."},
                    "flag": {"type": "boolean", "description": "A flag."},
                    "list": {"type": "array", "items": {"type": "string"}},
                    "start": {"type": "string", "default": "prose"},
                    "limit": {"type": "integer", "minimum": 1}
                }
            })
        );
    }

    #[test]
    fn an_optional_argument_typed_without_null_still_parses_null() {
        let schema = Value::Object((*input::<super::super::CompressContextArgs>()).clone());
        assert_eq!(schema["properties"]["session"]["type"], "string", "{schema}");
        let sent = json!({"task": "t", "context": {"fields": []}, "budget": 5, "session": null, "render": null});
        let Value::Object(m) = sent else { unreachable!() };
        let a = super::super::Args::<super::super::CompressContextArgs>(m, std::marker::PhantomData).parse().unwrap();
        assert!(a.session.is_none() && a.render.is_none());
    }

    #[test]
    fn output_schemas_name_the_keys_every_result_has() {
        let out = Value::Object((*output::<crate::view::CompressOutput>()).clone());
        let full = rmcp::handler::server::common::schema_for_output::<crate::view::CompressOutput>();
        assert_eq!(out["required"], full["required"]);
        let required: Vec<&str> = out["required"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
        assert_eq!(required, ["text", "chunks", "totals", "dropped", "withheld_fields", "warnings", "session_id"]);
        assert_eq!(out.as_object().unwrap().len(), 2, "{out}");
    }
}
