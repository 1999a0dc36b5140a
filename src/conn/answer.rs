//! hyper's bare answers to heads it cannot take, recognised as written and replaced with
//! problem+json.

use axum::http::StatusCode;

use crate::domain::headers::{PROBLEM_JSON, REQUEST_ID};
use crate::http::error::ApiError;

pub(super) const LONGEST: usize = 256;

const HYPER_MAX_URI: usize = u16::MAX as usize - 1;

#[derive(Debug, PartialEq, Eq)]
pub(super) struct HyperAnswer<'a> {
    status_line: &'a str,
    status: StatusCode,
    date: Option<&'a str>,
}

/// The answer hyper writes for a refused head, if `bytes` are exactly that.
pub(super) fn recognise(bytes: &[u8]) -> Option<HyperAnswer<'_>> {
    let text = std::str::from_utf8(bytes).ok()?.strip_suffix("\r\n\r\n")?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let status = match rest.get(..3)? {
        "400" => StatusCode::BAD_REQUEST,
        "414" => StatusCode::URI_TOO_LONG,
        "431" => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        _ => return None,
    };
    let mut date = None;
    for line in lines {
        match line.split_once(": ")? {
            ("connection", "close") | ("content-length", "0") => {}
            ("date", value) => date = Some(value),
            _ => return None,
        }
    }
    Some(HyperAnswer {
        status_line,
        status,
        date,
    })
}

fn error_for(answer: &HyperAnswer<'_>, head: &super::HeadLimits) -> ApiError {
    match answer.status {
        StatusCode::URI_TOO_LONG => ApiError::UriTooLong {
            size: None,
            limit: HYPER_MAX_URI,
        },
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => ApiError::HeadTooLarge {
            bytes: head.buffer_bytes,
            fields: head.fields,
        },
        _ => ApiError::InvalidRequest(
            "the request is not HTTP/1.1 this server can read: a malformed request line or header, \
             a malformed or conflicting Content-Length, or a Transfer-Encoding it may not have. \
             Nothing was done; the connection is closed"
                .into(),
        ),
    }
}

pub(super) fn replacement(answer: &HyperAnswer<'_>, head: &super::HeadLimits) -> Vec<u8> {
    let error = error_for(answer, head);
    let request_id = uuid::Uuid::new_v4().to_string();
    tracing::debug!(
        request_id,
        status = answer.status.as_u16(),
        "answered a request head hyper could not take"
    );
    let body = error.problem_json();
    let date = answer
        .date
        .map_or_else(String::new, |d| format!("date: {d}\r\n"));
    format!(
        "{}\r\ncontent-type: {PROBLEM_JSON}\r\n{REQUEST_ID}: {request_id}\r\ncontent-length: {}\r\nconnection: close\r\n{date}\r\n{body}",
        answer.status_line,
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const DATE: &str = "Thu, 03 Dec 2026 14:13:23 GMT";

    fn bare(status_line: &str) -> String {
        format!("{status_line}\r\nconnection: close\r\ncontent-length: 0\r\ndate: {DATE}\r\n\r\n")
    }

    #[test]
    fn hyper_s_own_400_414_and_431_are_recognised() {
        for (line, status) in [
            ("HTTP/1.1 400 Bad Request", 400),
            ("HTTP/1.1 414 URI Too Long", 414),
            ("HTTP/1.0 431 Request Header Fields Too Large", 431),
        ] {
            let text = bare(line);
            let answer = recognise(text.as_bytes()).unwrap();
            assert_eq!(answer.status.as_u16(), status);
            assert_eq!((answer.status_line, answer.date), (line, Some(DATE)));
        }
    }

    #[test]
    fn an_answer_with_any_other_header_or_a_body_is_not_hyper_s_own() {
        let line = "HTTP/1.1 400 Bad Request";
        let with_id =
            format!("{line}\r\nx-request-id: r\r\nconnection: close\r\ncontent-length: 0\r\n\r\n");
        let with_body = format!("{line}\r\ncontent-length: 2\r\n\r\n{{}}");
        let other_status = bare("HTTP/1.1 404 Not Found");
        let partial = bare(line);
        let partial = &partial[..partial.len() - 2];
        for text in [&with_id, &with_body, &other_status, partial] {
            assert_eq!(recognise(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn the_replacement_is_problem_json_with_a_request_id_and_closes_the_connection() {
        let text = bare("HTTP/1.1 400 Bad Request");
        let answer = recognise(text.as_bytes()).unwrap();
        let head = super::super::HeadLimits::for_rules(&crate::Rules::default());
        let reply = String::from_utf8(replacement(&answer, &head)).unwrap();
        let (head_text, body) = reply.split_once("\r\n\r\n").unwrap();
        assert!(head_text.starts_with("HTTP/1.1 400 Bad Request\r\n"));
        assert!(head_text.contains("\r\ncontent-type: application/problem+json\r\n"));
        assert!(head_text.contains("\r\nconnection: close\r\n"));
        assert!(head_text.contains(&format!("\r\ndate: {DATE}")));
        assert!(head_text.contains(&format!("\r\ncontent-length: {}\r\n", body.len())));
        let id = head_text
            .split("\r\n")
            .find_map(|l| l.strip_prefix("x-request-id: "))
            .unwrap();
        assert_eq!(id.len(), 36);
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(
            (problem["code"].as_str(), problem["status"].as_u64()),
            (Some("invalid_request"), Some(400))
        );
    }
}
