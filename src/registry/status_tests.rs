//! Tests of `status` (the registry's status machine).
use super::*;

fn rewrite(message: Option<&str>, json: &str) -> String {
    let o = Observed::Rewrite {
        status: TaskStatus::Completed,
        status_message: message.map(str::to_string),
    };
    let out = o.rewrite_bytes(json.as_bytes(), &["result"]).unwrap();
    String::from_utf8(out.to_vec()).unwrap()
}

#[test]
fn would_change_is_false_for_a_poll_repeating_a_terminal_status() {
    let mut r = crate::layers::testing::record("t1");
    r.status = TaskStatus::Completed;
    let same = serde_json::json!({"status": "completed", "lastUpdatedAt": "2030-01-01T00:00:00Z", "statusMessage": "x"});
    assert!(
        !Registry::would_change(&r, &same),
        "a terminal record never changes"
    );
    let other = serde_json::json!({"status": "failed"});
    assert!(
        Registry::would_change(&r, &other),
        "a contradiction is counted once"
    );
    r.status = TaskStatus::Working;
    assert!(Registry::would_change(&r, &same), "working -> completed");
    let poll = serde_json::json!({"status": "working", "lastUpdatedAt": r.last_updated_at.clone()});
    assert!(!Registry::would_change(&r, &poll));
}

#[test]
fn rewrite_bytes_splices_status_and_message() {
    let big = r#""n":123456789012345678901234567890"#;
    // Replace both.
    let json = format!(r#"{{"result":{{"z":1,"status":"working","statusMessage":"x",{big}}}}}"#);
    let want =
        format!(r#"{{"result":{{"z":1,"status":"completed","statusMessage":"done",{big}}}}}"#);
    assert_eq!(rewrite(Some("done"), &json), want);
    // Remove the message.
    let want = format!(r#"{{"result":{{"z":1,"status":"completed",{big}}}}}"#);
    assert_eq!(rewrite(None, &json), want);
    // Insert a message after `status`.
    let json = format!(r#"{{"result":{{"status":"working",{big}}}}}"#);
    let want = format!(r#"{{"result":{{"status":"completed","statusMessage":"a \"b\"",{big}}}}}"#);
    assert_eq!(rewrite(Some("a \"b\""), &json), want);
    // No message on either side.
    let want = format!(r#"{{"result":{{"status":"completed",{big}}}}}"#);
    assert_eq!(rewrite(None, &json), want);
}

#[test]
fn rewrite_bytes_falls_back_to_a_full_rewrite_for_an_escaped_key() {
    let json = r#"{"result":{"status":"working","status\u004dessage":"x"}}"#;
    let v: Value = serde_json::from_str(&rewrite(None, json)).unwrap();
    assert_eq!(v, serde_json::json!({"result":{"status":"completed"}}));
    let o = Observed::Recorded(TaskStatus::Working);
    assert!(o.rewrite_bytes(json.as_bytes(), &["result"]).is_none());
    let not_object = r#"{"result":[1]}"#;
    let o = Observed::Rewrite {
        status: TaskStatus::Completed,
        status_message: None,
    };
    assert!(o
        .rewrite_bytes(not_object.as_bytes(), &["result"])
        .is_none());
}
