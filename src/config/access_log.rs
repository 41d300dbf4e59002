//! `[access_log]` checked into [`AccessLogConfig`]: where lines go, their format (JSON lines
//! or an nginx-like template of `$fields`), sampling, and W3C trace context.

use serde::Serialize;

use super::file::FileAccessLog;
use super::validate::Validator;
use super::*;

/// Where access log lines go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Destination {
    Off,
    Stdout,
    File(PathBuf),
}

/// One field of a line, by its name in `text_format` (`$name`) and its JSON key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Field {
    Time,
    RequestId,
    Client,
    Method,
    Path,
    Model,
    Router,
    Worker,
    PrefillWorker,
    Status,
    Knob,
    Class,
    Migrations,
    QueueMs,
    TtftMs,
    DurationMs,
    BytesIn,
    BytesOut,
    Closed,
    TraceId,
}

impl Field {
    pub const ALL: [Field; 20] = [
        Field::Time,
        Field::RequestId,
        Field::Client,
        Field::Method,
        Field::Path,
        Field::Model,
        Field::Router,
        Field::Worker,
        Field::PrefillWorker,
        Field::Status,
        Field::Knob,
        Field::Class,
        Field::Migrations,
        Field::QueueMs,
        Field::TtftMs,
        Field::DurationMs,
        Field::BytesIn,
        Field::BytesOut,
        Field::Closed,
        Field::TraceId,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Field::Time => "time",
            Field::RequestId => "request_id",
            Field::Client => "client",
            Field::Method => "method",
            Field::Path => "path",
            Field::Model => "model",
            Field::Router => "router",
            Field::Worker => "worker",
            Field::PrefillWorker => "prefill_worker",
            Field::Status => "status",
            Field::Knob => "knob",
            Field::Class => "class",
            Field::Migrations => "migrations",
            Field::QueueMs => "queue_ms",
            Field::TtftMs => "ttft_ms",
            Field::DurationMs => "duration_ms",
            Field::BytesIn => "bytes_in",
            Field::BytesOut => "bytes_out",
            Field::Closed => "closed",
            Field::TraceId => "trace_id",
        }
    }
}

/// A piece of a text line: literal text or a field.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Piece {
    Text(String),
    Field(Field),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum Format {
    Json,
    Text(Vec<Piece>),
}

/// What to do with W3C trace context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum TraceParent {
    /// Pass a client's valid `traceparent` (and its `tracestate`) through; create one
    /// when it is absent or invalid (an invalid one and any `tracestate` are dropped).
    Create,
    /// Pass a valid one through only; never create one. An invalid `traceparent` and any
    /// `tracestate` without a valid one are dropped, not forwarded (W3C Trace Context).
    Pass,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccessLogConfig {
    pub destination: Destination,
    pub format: Format,
    /// Successes logged 1 in `sample` (refusals and errors always).
    pub sample: u32,
    pub traceparent: TraceParent,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            destination: Destination::Off,
            format: Format::Json,
            sample: 1,
            traceparent: TraceParent::Create,
        }
    }
}

pub const DEFAULT_TEXT_FORMAT: &str = "$client - - [$time] \"$method $path\" $status $bytes_out \
rid=$request_id model=$model worker=$worker knob=$knob class=$class mig=$migrations \
queue=$queue_ms ttft=$ttft_ms rt=$duration_ms in=$bytes_in closed=$closed trace=$trace_id";

/// `$name` fields of a template, the rest literal; `$$` is a literal `$`.
pub fn parse_template(t: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut rest = t;
    while let Some(i) = rest.find('$') {
        text.push_str(&rest[..i]);
        rest = &rest[i + 1..];
        if let Some(r) = rest.strip_prefix('$') {
            text.push('$');
            rest = r;
            continue;
        }
        let n = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        let name = &rest[..n];
        let Some(f) = Field::ALL.iter().find(|f| f.name() == name) else {
            let known: Vec<_> = Field::ALL.iter().map(|f| f.name()).collect();
            return Err(format!(
                "unknown field ${name}; fields: {}",
                known.join(", ")
            ));
        };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Field(*f));
        rest = &rest[n..];
    }
    text.push_str(rest);
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

impl Validator<'_> {
    pub(super) fn access_log(
        &self,
        f: &Option<FileAccessLog>,
    ) -> Result<AccessLogConfig, ConfigError> {
        let Some(f) = f else {
            return Ok(AccessLogConfig::default());
        };
        let destination = match &f.path {
            None => Destination::Off,
            Some(p) => match p.get_ref().as_str() {
                "off" => Destination::Off,
                "stdout" | "-" => Destination::Stdout,
                "" => {
                    return self.err(
                        "access_log.path",
                        Some(p.span()),
                        "must be a file path, \"stdout\" or \"off\"",
                    );
                }
                path => Destination::File(PathBuf::from(path)),
            },
        };
        let template = f.text_format.as_ref();
        let format = match f.format.as_ref().map(|s| (s.get_ref().as_str(), s.span())) {
            None | Some(("json", _)) => Format::Json,
            Some(("text", _)) => {
                let t = template.map_or(DEFAULT_TEXT_FORMAT, |t| t.get_ref().as_str());
                match parse_template(t) {
                    Ok(p) => Format::Text(p),
                    Err(e) => {
                        return self.err("access_log.text_format", template.map(|t| t.span()), e);
                    }
                }
            }
            Some((other, span)) => {
                return self.err(
                    "access_log.format",
                    Some(span),
                    format!("must be \"json\" or \"text\", got \"{other}\""),
                );
            }
        };
        if let (Format::Json, Some(t)) = (&format, template) {
            return self.err(
                "access_log.text_format",
                Some(t.span()),
                "needs format = \"text\"",
            );
        }
        let sample = self.positive("access_log.sample", &f.sample, 1)?;
        let traceparent = match f
            .traceparent
            .as_ref()
            .map(|s| (s.get_ref().as_str(), s.span()))
        {
            None | Some(("create", _)) => TraceParent::Create,
            Some(("pass", _)) => TraceParent::Pass,
            Some((other, span)) => {
                return self.err(
                    "access_log.traceparent",
                    Some(span),
                    format!("must be \"create\" or \"pass\", got \"{other}\""),
                );
            }
        };
        Ok(AccessLogConfig {
            destination,
            format,
            sample,
            traceparent,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(table: &str) -> Result<Config, ConfigError> {
        Config::parse(
            &format!(
                "[access_log]\n{table}\n[[models]]\nname = \"m\"\n[[models.workers]]\nurl = \"http://127.0.0.1:1\"\n"
            ),
            &Overrides::default(),
        )
    }

    #[test]
    fn defaults_and_errors() {
        let c = parse("").unwrap();
        assert_eq!(c.access_log, AccessLogConfig::default());
        let c = parse("path = \"/tmp/x.log\"\nformat = \"text\"\nsample = 10").unwrap();
        assert_eq!(
            c.access_log.destination,
            Destination::File("/tmp/x.log".into())
        );
        assert_eq!(c.access_log.sample, 10);
        assert!(matches!(c.access_log.format, Format::Text(_)));
        let e = parse("format = \"xml\"").unwrap_err().to_string();
        assert_eq!(
            e,
            "access_log.format (line 2): must be \"json\" or \"text\", got \"xml\""
        );
        let e = parse("format = \"text\"\ntext_format = \"$status $nope\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("access_log.text_format (line 3): unknown field $nope"),
            "{e}"
        );
        let e = parse("sample = 0").unwrap_err().to_string();
        assert_eq!(e, "access_log.sample (line 2): must be greater than 0");
        let e = parse("text_format = \"$status\"").unwrap_err().to_string();
        assert_eq!(
            e,
            "access_log.text_format (line 2): needs format = \"text\""
        );
        let e = parse("traceparent = \"off\"").unwrap_err().to_string();
        assert!(e.contains("must be \"create\" or \"pass\""), "{e}");
    }

    #[test]
    fn templates() {
        let p = parse_template("a $status $$ x$ttft_ms.").unwrap();
        assert_eq!(
            p,
            vec![
                Piece::Text("a ".into()),
                Piece::Field(Field::Status),
                Piece::Text(" $ x".into()),
                Piece::Field(Field::TtftMs),
                Piece::Text(".".into()),
            ]
        );
        assert!(parse_template(DEFAULT_TEXT_FORMAT).is_ok());
    }
}
