//! A2A v1.0 wire types (the proto3 JSON form of `a2a.proto`: camelCase keys,
//! `TASK_STATE_*` / `ROLE_*` enum names). Requests are parsed strictly:
//! keys outside the schema are errors naming their JSON path.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `Role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    /// The client.
    #[serde(rename = "ROLE_USER")]
    User,
    /// This agent.
    #[serde(rename = "ROLE_AGENT")]
    Agent,
}

/// `TaskState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaskState {
    /// Accepted, not started.
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    /// Running.
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    /// Done; the artifact holds the result.
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    /// The engine failed.
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    /// Canceled by the client.
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    /// Waiting for the client's next message.
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    /// The agent declined the input.
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
    /// Never set by SCD (accepted in filters only).
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
}

impl TaskState {
    /// Completed, failed, canceled and rejected tasks never change again.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled | Self::Rejected)
    }

    /// Parses the proto enum name (`TASK_STATE_COMPLETED`).
    pub fn parse(s: &str) -> Option<Self> {
        serde_json::from_value(Value::String(s.to_string())).ok()
    }

    /// The proto enum name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Submitted => "TASK_STATE_SUBMITTED",
            Self::Working => "TASK_STATE_WORKING",
            Self::Completed => "TASK_STATE_COMPLETED",
            Self::Failed => "TASK_STATE_FAILED",
            Self::Canceled => "TASK_STATE_CANCELED",
            Self::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            Self::Rejected => "TASK_STATE_REJECTED",
            Self::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
        }
    }
}

fn is_empty_vec<T>(v: &[T]) -> bool {
    v.is_empty()
}

/// `Part`: exactly one of text, raw, url or data.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Part {
    /// Text content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Base64 bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// A file by URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Structured JSON content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Free-form metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// File name of a raw/url part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    /// Media type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

impl Part {
    /// A text part.
    pub fn text(t: impl Into<String>) -> Self {
        Self { text: Some(t.into()), ..Self::default() }
    }

    /// A data part.
    pub fn data(v: Value) -> Self {
        Self { data: Some(v), media_type: Some("application/json".into()), ..Self::default() }
    }

    /// How many of the content keys are set (a valid part has exactly one).
    pub fn contents(&self) -> usize {
        [self.text.is_some(), self.raw.is_some(), self.url.is_some(), self.data.is_some()]
            .iter()
            .filter(|b| **b)
            .count()
    }
}

/// `Message`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Message {
    /// Sender-chosen id.
    pub message_id: String,
    /// The conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_id: Option<String>,
    /// The task it continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Who sent it.
    pub role: Role,
    /// The content.
    pub parts: Vec<Part>,
    /// Free-form metadata (`currentConfidence` is read by SCD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// Extension URIs.
    #[serde(default, skip_serializing_if = "is_empty_vec")]
    pub extensions: Vec<String>,
    /// Related tasks.
    #[serde(default, skip_serializing_if = "is_empty_vec")]
    pub reference_task_ids: Vec<String>,
}

impl Message {
    /// An agent message in `task` of `context`.
    pub fn agent(task: &str, context: &str, parts: Vec<Part>) -> Self {
        Self {
            message_id: uuid_v4(),
            context_id: Some(context.to_string()),
            task_id: Some(task.to_string()),
            role: Role::Agent,
            parts,
            metadata: None,
            extensions: Vec::new(),
            reference_task_ids: Vec::new(),
        }
    }
}

/// `TaskStatus`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// The state.
    pub state: TaskState,
    /// The agent's explanation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Message>,
    /// RFC 3339, UTC.
    pub timestamp: String,
}

/// `Artifact`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Unique within the task.
    pub artifact_id: String,
    /// Short name.
    pub name: String,
    /// What it holds.
    pub description: String,
    /// Content.
    pub parts: Vec<Part>,
}

/// `Task`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    /// Server-chosen id.
    pub id: String,
    /// Its conversation (one SCD session per context).
    pub context_id: String,
    /// Current status.
    pub status: TaskStatus,
    /// Results.
    #[serde(skip_serializing_if = "is_empty_vec")]
    pub artifacts: Vec<Artifact>,
    /// Messages exchanged.
    #[serde(skip_serializing_if = "is_empty_vec")]
    pub history: Vec<Message>,
}

/// `SendMessageConfiguration`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendConfiguration {
    /// Output media types the client accepts.
    #[serde(default)]
    pub accepted_output_modes: Vec<String>,
    /// Push notifications (not supported: must be absent).
    #[serde(default)]
    pub task_push_notification_config: Option<Value>,
    /// Messages of history in the reply.
    #[serde(default)]
    pub history_length: Option<i32>,
    /// Answer at once with the task still working.
    #[serde(default)]
    pub return_immediately: bool,
}

/// `SendMessageRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendMessageRequest {
    /// Tenant (SCD has one; must be empty).
    #[serde(default)]
    pub tenant: String,
    /// The message.
    pub message: Message,
    /// Options.
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
    /// Free-form metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// `GetTaskRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetTaskRequest {
    /// Tenant (must be empty).
    #[serde(default)]
    pub tenant: String,
    /// The task.
    pub id: String,
    /// Messages of history in the reply.
    #[serde(default)]
    pub history_length: Option<i32>,
}

/// `CancelTaskRequest` / `SubscribeToTaskRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TaskIdRequest {
    /// Tenant (must be empty).
    #[serde(default)]
    pub tenant: String,
    /// The task.
    pub id: String,
    /// Free-form metadata.
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// `ListTasksRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListTasksRequest {
    /// Tenant (must be empty).
    #[serde(default)]
    pub tenant: String,
    /// Only this context's tasks.
    #[serde(default)]
    pub context_id: Option<String>,
    /// Only tasks in this state.
    #[serde(default)]
    pub status: Option<String>,
    /// 1 to 100; default 50.
    #[serde(default)]
    pub page_size: Option<i32>,
    /// From a previous reply's `nextPageToken`.
    #[serde(default)]
    pub page_token: Option<String>,
    /// Messages of history per task (default 0).
    #[serde(default)]
    pub history_length: Option<i32>,
    /// Only tasks updated after this RFC 3339 time.
    #[serde(default)]
    pub status_timestamp_after: Option<String>,
    /// Include artifacts (default false).
    #[serde(default)]
    pub include_artifacts: Option<bool>,
}

/// A random (version 4) UUID, hyphenated.
pub fn uuid_v4() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// RFC 3339 UTC time with milliseconds of `t`.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    scd_did::time::format_rfc3339_ms(t)
}

/// Parses an RFC 3339 time (`2026-12-01T04:00:00Z`, fraction and offset
/// allowed; see [`scd_did::time`] for the grammar).
pub fn parse_rfc3339(s: &str) -> Option<std::time::SystemTime> {
    let t = scd_did::time::parse_rfc3339(s).ok()?;
    std::time::SystemTime::try_from(t).ok().filter(|t| *t >= std::time::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_and_messages_parse_strictly() {
        let m: Message = serde_json::from_value(serde_json::json!({
            "messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}, {"data": {"a": 1}}]
        }))
        .unwrap();
        assert_eq!(m.parts[0].contents(), 1);
        assert_eq!(m.parts[1].data, Some(serde_json::json!({"a": 1})));
        let bad = serde_json::from_value::<Message>(serde_json::json!({
            "messageId": "m1", "role": "ROLE_USER", "parts": [], "kind": "message"
        }));
        assert!(bad.unwrap_err().to_string().contains("unknown field `kind`"));
        assert!(serde_json::from_value::<Message>(serde_json::json!({
            "messageId": "m1", "role": "user", "parts": []
        }))
        .is_err());
    }

    #[test]
    fn states_round_trip_and_terminal_ones_are_known() {
        for s in ["TASK_STATE_COMPLETED", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_REJECTED"] {
            assert_eq!(TaskState::parse(s).unwrap().name(), s);
        }
        assert!(TaskState::parse("completed").is_none());
        assert!(TaskState::Canceled.is_terminal() && !TaskState::InputRequired.is_terminal());
    }

    #[test]
    fn time_and_ids_are_well_formed() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_764_547_200_123);
        assert_eq!(rfc3339(t), "2025-12-01T00:00:00.123Z");
        assert_eq!(parse_rfc3339("2025-12-01T00:00:00.123Z"), Some(t));
        assert_eq!(parse_rfc3339("2025-12-01T01:00:00.123+01:00"), Some(t));
        assert_eq!(parse_rfc3339("not-a-timestamp"), None);
        assert_eq!(parse_rfc3339("2025-13-01T00:00:00Z"), None);
        assert_eq!(parse_rfc3339("2025-02-31T00:00:00Z"), None, "the calendar is checked");
        // multi-byte characters anywhere are refused, never sliced through
        for bad in [
            "2025-12-01T00:00:00+aé00",
            "2025-12-01T00:00:00+é:00",
            "2025-12-01T00:00:00+0é00",
            "2025-12-01T00:00:00.1é",
            "2025-12-01T00:00:0é+00:00",
            "2025-12-01T00:00:00+01:é",
            "2025-12-01T00:00:00+-1:00",
            "ééééééééééééééééééééé",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        let id = uuid_v4();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }
}
