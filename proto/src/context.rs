//! The one mapping between the context model (`scd-context`) and the
//! `scd.v1` wire types, used by the CLI's client, the ATP stack and the
//! server alike. The server's direction (wire → model) also validates, so
//! it lives with the server's error mapping; the kind mapping is here.
//!
//! ```
//! use scd_context::{Field, FieldKind, Task};
//! use scd_proto::scd::v1 as pb;
//!
//! let f = Field { name: "logs".into(), kind: FieldKind::Log, content: "E1".into(), confidential: true };
//! let wire = pb::Field::from(&f);
//! assert_eq!((wire.kind, wire.confidential), (pb::FieldKind::Log as i32, true));
//! assert_eq!(FieldKind::try_from(pb::FieldKind::Log), Ok(FieldKind::Log));
//! assert!(FieldKind::try_from(pb::FieldKind::Unspecified).is_err());
//! let t = Task { output_schema: Some(String::new()), ..Task::new("x") };
//! assert_eq!(pb::Task::from(&t).output_schema, "");
//! ```

use scd_context::{Field, FieldKind, Task};

use crate::scd::v1 as pb;

impl From<FieldKind> for pb::FieldKind {
    fn from(k: FieldKind) -> Self {
        match k {
            FieldKind::Prose => pb::FieldKind::Prose,
            FieldKind::Code => pb::FieldKind::Code,
            FieldKind::Log => pb::FieldKind::Log,
            FieldKind::Json => pb::FieldKind::Json,
            FieldKind::Chat => pb::FieldKind::Chat,
            FieldKind::Table => pb::FieldKind::Table,
            FieldKind::Markdown => pb::FieldKind::Markdown,
        }
    }
}

/// `FIELD_KIND_UNSPECIFIED` has no model kind: the caller must name one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnspecifiedKind;

impl TryFrom<pb::FieldKind> for FieldKind {
    type Error = UnspecifiedKind;

    fn try_from(k: pb::FieldKind) -> Result<Self, UnspecifiedKind> {
        Ok(match k {
            pb::FieldKind::Unspecified => return Err(UnspecifiedKind),
            pb::FieldKind::Prose => FieldKind::Prose,
            pb::FieldKind::Code => FieldKind::Code,
            pb::FieldKind::Log => FieldKind::Log,
            pb::FieldKind::Json => FieldKind::Json,
            pb::FieldKind::Chat => FieldKind::Chat,
            pb::FieldKind::Table => FieldKind::Table,
            pb::FieldKind::Markdown => FieldKind::Markdown,
        })
    }
}

impl From<&Field> for pb::Field {
    fn from(f: &Field) -> Self {
        pb::Field {
            name: f.name.clone(),
            kind: pb::FieldKind::from(f.kind) as i32,
            content: f.content.clone(),
            confidential: f.confidential,
        }
    }
}

impl From<Field> for pb::Field {
    fn from(f: Field) -> Self {
        pb::Field {
            kind: pb::FieldKind::from(f.kind) as i32,
            name: f.name,
            content: f.content,
            confidential: f.confidential,
        }
    }
}

impl From<&Task> for pb::Task {
    fn from(t: &Task) -> Self {
        pb::Task {
            description: t.description.clone(),
            constraints: t.constraints.clone(),
            output_schema: t.schema().unwrap_or_default().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_the_wire() {
        for k in FieldKind::ALL {
            assert_eq!(FieldKind::try_from(pb::FieldKind::from(k)), Ok(k));
            // the wire's enum name carries the model's word
            assert_eq!(pb::FieldKind::from(k).as_str_name(), format!("FIELD_KIND_{}", k.as_str().to_uppercase()));
        }
    }
}
