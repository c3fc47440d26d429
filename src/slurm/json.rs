//! Reads the job lists Slurm prints as JSON: `scontrol --json show job`, `squeue --json` and
//! `sacct --json`, in every shape the supported versions print.
//!
//! JSON is read because every text form of these commands lets a job owner forge fields: a
//! job name, comment or (26.05) submit line may hold a newline or `Key=Value` words. Here a
//! user field is a JSON string and never more.
//!
//! The shapes, all captured from real Slurm (`tests/fixtures/slurm-*/`):
//! - 22.05, `squeue --json` (openapi v0.0.38): `job_state` a string (`"COMPLETING"`), times
//!   plain numbers, `exit_code` the raw wait status (768 = exit 3, 15 = signal 15).
//! - 22.05, `sacct --json` (openapi dbv0.0.38): `state.current` a string, `time.start`,
//!   `exit_code` `{status, return_code, signal: {signal_id}}`.
//! - 23.02 and later, data_parser v0.0.39 … v0.0.45: `job_state` a list (base state first, then
//!   flags: `["CANCELLED","COMPLETING"]`), numbers as `{set, infinite, number}`, `exit_code`
//!   `{status: [..], return_code, signal: {id, name}}`; sacct's `state.current` a list and its
//!   times plain numbers.

use super::JobInfo;
use serde_json::Value;

/// A number, whether plain or Slurm's `{set, infinite, number}`; `None` when unset or infinite.
fn num(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::Object(o) => {
            if o.get("set").and_then(Value::as_bool) == Some(false)
                || o.get("infinite").and_then(Value::as_bool) == Some(true)
            {
                return None;
            }
            o.get("number").and_then(num)
        }
        _ => None,
    }
}

/// An epoch time: `None` for 0 (Slurm's "unknown") and anything CloudVision cannot show.
fn epoch(v: &Value) -> Option<i64> {
    num(v).filter(|t| *t > 0 && *t <= 253_402_300_799)
}

/// A non-empty string.
fn text(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(String::from)
}

/// A state: one word (`"RUNNING"`) or a list of words (`["CANCELLED","COMPLETING"]`).
fn states(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) if !s.is_empty() => vec![s.clone()],
        Value::Array(a) => a.iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// `exit:signal` as Slurm's text prints it, from any of the JSON shapes.
fn exit_code(v: &Value) -> Option<String> {
    match v {
        // 22.05 squeue: the raw wait status.
        Value::Number(_) => {
            let status = num(v)?;
            let sig = status & 0x7f;
            let code = if sig == 0 { (status >> 8) & 0xff } else { 0 };
            Some(format!("{code}:{sig}"))
        }
        Value::Object(o) => {
            let code = o.get("return_code").and_then(num).unwrap_or(0);
            let sig = o
                .get("signal")
                .and_then(|s| s.get("id").or_else(|| s.get("signal_id")))
                .and_then(num)
                .unwrap_or(0);
            Some(format!("{code}:{sig}"))
        }
        _ => None,
    }
}

/// One job of any of the lists. `None` for an entry without a job id.
fn job(j: &Value) -> Option<JobInfo> {
    let id = num(&j["job_id"]).filter(|n| *n > 0)?;
    // sacct nests state, times and array data; scontrol and squeue do not.
    let acct = j.get("state").is_some_and(Value::is_object);
    let (states, reason, start, end, array_job, array_task, het_job, het_offset) = if acct {
        let st = &j["state"];
        (
            states(&st["current"]),
            text(&st["reason"]),
            epoch(&j["time"]["start"]),
            epoch(&j["time"]["end"]),
            num(&j["array"]["job_id"]),
            num(&j["array"]["task_id"]),
            num(&j["het"]["job_id"]),
            num(&j["het"]["job_offset"]),
        )
    } else {
        (
            states(&j["job_state"]),
            text(&j["state_reason"]),
            epoch(&j["start_time"]),
            epoch(&j["end_time"]),
            num(&j["array_job_id"]),
            num(&j["array_task_id"]),
            num(&j["het_job_id"]),
            num(&j["het_job_offset"]),
        )
    };
    let array = array_job.filter(|a| *a > 0).zip(array_task);
    // 0 is "not a heterogeneous job"; a component's offset is below Slurm's 128 components.
    let het = het_job
        .filter(|h| *h > 0 && *h <= i64::from(u32::MAX))
        .zip(match het_offset {
            None => Some(0),
            Some(o) => u32::try_from(o).ok(),
        })
        .filter(|(_, o)| *o < super::HET_MAX_COMPONENTS);
    Some(JobInfo {
        job_id: id.to_string(),
        name: j["name"].as_str().unwrap_or("").to_string(),
        partition: text(&j["partition"]),
        state: states.first().cloned().unwrap_or_default(),
        states,
        reason,
        exit_code: exit_code(&j["exit_code"]),
        restarts: num(&j["restart_cnt"]).and_then(|n| u32::try_from(n).ok()),
        start,
        end,
        nodelist: text(&j["nodes"]).filter(|n| n != "None assigned"),
        array_job_id: array.map(|(a, _)| a.to_string()),
        array_task_id: array.map(|(_, t)| t.to_string()),
        het_job_id: het.map(|(h, _)| h.to_string()),
        het_job_offset: het.map(|(_, o)| o),
    })
}

/// Every job of a `{"jobs": [...]}` document, in Slurm's order.
///
/// An error when the text is not such a document, or when Slurm reports errors and no jobs
/// (the message is Slurm's first error).
pub fn parse_jobs(output: &str) -> Result<Vec<JobInfo>, String> {
    let doc: Value = serde_json::from_str(output)
        .map_err(|e| format!("Slurm's JSON output cannot be read: {e}"))?;
    let Some(list) = doc.get("jobs").and_then(Value::as_array) else {
        return Err(match first_error(&doc) {
            Some(e) => e,
            None => "Slurm's JSON output has no job list".to_string(),
        });
    };
    if list.is_empty() {
        if let Some(e) = first_error(&doc) {
            return Err(e);
        }
    }
    Ok(list.iter().filter_map(job).collect())
}

/// Every job of `squeue --only-job-state --json` (24.11, 26.05): `{"jobs": [{"job_id":
/// "5_2", "state": ["RUNNING"]}, …]}`, as [`JobInfo`]s with only the id and the state set.
/// `job_id` is a string: the job's own id, then for an array task `_` and the task id (task 1
/// of array 5, itself job 6, is `"6_1"`; the text form prints `5_1`). An entry whose id is no
/// job id is skipped.
pub fn parse_job_states(output: &str) -> Result<Vec<JobInfo>, String> {
    let doc: Value = serde_json::from_str(output)
        .map_err(|e| format!("Slurm's JSON output cannot be read: {e}"))?;
    let Some(list) = doc.get("jobs").and_then(Value::as_array) else {
        return Err(
            first_error(&doc).unwrap_or_else(|| "Slurm's JSON output has no job list".into())
        );
    };
    Ok(list
        .iter()
        .filter_map(|j| {
            let raw = match &j["job_id"] {
                Value::String(s) => s.clone(),
                v => num(v)?.to_string(),
            };
            let (own, task) = match raw.split_once('_') {
                Some((own, task)) => (own, Some(task)),
                None => (raw.as_str(), None),
            };
            let digits =
                |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
            // A component of a heterogeneous job: `<own id>+<own id - leader's id>`.
            let (own, het) = match own.split_once('+') {
                Some((own, off)) if task.is_none() && digits(own) && digits(off) => {
                    let (id, off) = (own.parse::<u32>().ok()?, off.parse::<u32>().ok()?);
                    let leader = id.checked_sub(off).filter(|l| *l > 0)?;
                    (own, Some((leader.to_string(), off)))
                }
                Some(_) => return None,
                None => (own, None),
            };
            if !digits(own) || own.bytes().all(|b| b == b'0') || task.is_some_and(|t| !digits(t)) {
                return None;
            }
            let states = states(&j["state"]);
            Some(JobInfo {
                job_id: own.to_string(),
                state: states.first().cloned().unwrap_or_default(),
                states,
                array_task_id: task.map(String::from),
                het_job_offset: het.as_ref().map(|h| h.1),
                het_job_id: het.map(|h| h.0),
                ..JobInfo::default()
            })
        })
        .collect())
}

/// Slurm's first error in a JSON answer (`errors[0].description`, else its `error`).
pub fn first_error(doc: &Value) -> Option<String> {
    let e = doc.get("errors")?.as_array()?.first()?;
    text(&e["description"])
        .or_else(|| text(&e["error"]))
        .or_else(|| Some(e.to_string()))
}

/// Slurm's first error in JSON output, if the output is JSON and has one.
pub fn error_of(output: &str) -> Option<String> {
    first_error(&serde_json::from_str(output).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_in_every_shape() {
        let v: Value = serde_json::from_str(
            r#"[5, {"set":true,"infinite":false,"number":7}, {"set":false,"infinite":false,"number":0},
               {"set":true,"infinite":true,"number":0}, null, "8", 1.0]"#,
        )
        .unwrap();
        let got: Vec<_> = v.as_array().unwrap().iter().map(num).collect();
        assert_eq!(got, [Some(5), Some(7), None, None, None, None, Some(1)]);
    }

    /// A heterogeneous job's component in every shape: scontrol/squeue's `het_job_id` and
    /// `het_job_offset` (plain on 22.05, `{set, number}` later), sacct's `het`; 0 is no het
    /// job; an offset Slurm cannot give makes no component.
    #[test]
    fn het_components_in_every_shape() {
        let het = |doc: &str| {
            let j = &parse_jobs(&format!(r#"{{"jobs":[{doc}]}}"#)).unwrap()[0];
            (j.het_job_id.clone(), j.het_job_offset)
        };
        let some = |l: &str, o| (Some(l.to_string()), Some(o));
        assert_eq!(
            het(r#"{"job_id":7,"het_job_id":6,"het_job_offset":1}"#),
            some("6", 1)
        );
        assert_eq!(
            het(
                r#"{"job_id":7,"het_job_id":{"set":true,"number":6},"het_job_offset":{"set":true,"number":1}}"#
            ),
            some("6", 1)
        );
        assert_eq!(
            het(
                r#"{"job_id":6,"state":{"current":["RUNNING"]},"het":{"job_id":6,"job_offset":{"set":true,"number":0}}}"#
            ),
            some("6", 0)
        );
        assert_eq!(
            het(
                r#"{"job_id":5,"state":{"current":"COMPLETED"},"het":{"job_id":0,"job_offset":null}}"#
            ),
            (None, None)
        );
        for bad in [
            r#"{"job_id":7,"het_job_id":6,"het_job_offset":128}"#,
            r#"{"job_id":7,"het_job_id":6,"het_job_offset":-1}"#,
            r#"{"job_id":7,"het_job_id":-6,"het_job_offset":1}"#,
            r#"{"job_id":7,"het_job_id":99999999999,"het_job_offset":1}"#,
        ] {
            assert_eq!(het(bad), (None, None), "{bad}");
        }
    }

    #[test]
    fn exit_codes_in_every_shape() {
        let e = |s: &str| exit_code(&serde_json::from_str(s).unwrap());
        // 22.05 squeue: wait status.
        assert_eq!(e("768").as_deref(), Some("3:0"));
        assert_eq!(e("15").as_deref(), Some("0:15"));
        assert_eq!(e("0").as_deref(), Some("0:0"));
        // 22.05 sacct.
        assert_eq!(
            e(r#"{"status":"SIGNALED","return_code":null,"signal":{"signal_id":9,"name":"Killed"}}"#)
                .as_deref(),
            Some("0:9")
        );
        // data_parser v0.0.39 and later.
        assert_eq!(
            e(
                r#"{"status":["SIGNALED"],"return_code":{"set":false,"infinite":false,"number":0},
                  "signal":{"id":{"set":true,"infinite":false,"number":15},"name":"TERM"}}"#
            )
            .as_deref(),
            Some("0:15")
        );
        assert_eq!(e("null"), None);
    }

    #[test]
    fn not_a_job_list() {
        assert!(parse_jobs("JobId=1 JobName=x")
            .unwrap_err()
            .contains("cannot be read"));
        assert_eq!(
            parse_jobs(r#"{"errors":[{"description":"Invalid job id specified"}],"jobs":[]}"#)
                .unwrap_err(),
            "Invalid job id specified"
        );
        assert!(parse_jobs(r#"{"jobs":[],"errors":[]}"#).unwrap().is_empty());
        assert_eq!(
            parse_jobs("{}").unwrap_err(),
            "Slurm's JSON output has no job list"
        );
        // Entries without a job id are skipped, not invented.
        assert!(parse_jobs(r#"{"jobs":[{"name":"x"},7]}"#)
            .unwrap()
            .is_empty());
    }
}
