//! The results block both ends send after `EXCHANGE_RESULTS` (the client
//! first): CPU use, whether the sender reports retransmits, and one entry
//! per stream with its bytes, retransmits and, for UDP, jitter, lost and
//! total datagrams. Streams are named by iperf3's stream ids, which
//! iperf3 numbers 1, 3, 4, 5, ... in connection order ([`stream_id`]).

use serde_json::{json, Map, Value};

/// iperf3's id of the stream at `index` (0-based connection order): the
/// first is 1 and the others skip 2, as every iperf3 release numbers them.
pub(crate) fn stream_id(index: u32) -> u32 {
    if index == 0 {
        1
    } else {
        index + 2
    }
}

/// The connection-order index of iperf3 stream `id`, if it names one.
pub(crate) fn stream_index(id: u64) -> Option<u32> {
    match id {
        1 => Some(0),
        0 | 2 => None,
        n => u32::try_from(n - 2).ok(),
    }
}

/// One stream's figures.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct StreamResult {
    /// iperf3's stream id.
    pub id: u32,
    /// Bytes this end sent (sending stream) or received (receiving stream),
    /// after the omitted seconds.
    pub bytes: u64,
    /// TCP retransmits of a sending stream; -1 when not reported.
    pub retransmits: i64,
    /// UDP receiver: jitter in seconds.
    pub(crate) jitter: f64,
    /// UDP receiver: datagrams lost; UDP sender: 0.
    pub(crate) errors: i64,
    /// UDP: datagrams sent (sender) or the highest sequence number seen
    /// (receiver).
    pub(crate) packets: i64,
    pub(crate) start_time: f64,
    pub(crate) end_time: f64,
}

/// One end's results block.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Results {
    /// Process CPU, percent of one core over the test (iperf3's
    /// cpu_util_total, _user, _system).
    pub(crate) cpu_util_total: f64,
    pub(crate) cpu_util_user: f64,
    pub(crate) cpu_util_system: f64,
    /// 1: this end sends and reports TCP retransmits; 0: sends without;
    /// -1: this end only receives.
    pub(crate) sender_has_retransmits: i64,
    pub(crate) congestion_used: Option<String>,
    pub(crate) streams: Vec<StreamResult>,
    /// The server's own report, when the client asked for it
    /// (`--get-server-output`).
    pub(crate) server_output_text: Option<String>,
}

/// A number as iperf3's JSON reader takes it (integer or float). iperf3
/// 3.12 writes its -1 ("not reported", e.g. a UDP stream's retransmits) as
/// an unsigned 1.8446744073709552e19: any value of 2^63 or more reads as
/// that -1, never as a huge count.
fn int(v: &Value) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    if v.as_u64().is_some() {
        return Some(-1);
    }
    let f = v.as_f64()?;
    if f >= i64::MAX as f64 {
        return Some(-1);
    }
    Some(f.max(i64::MIN as f64) as i64)
}

impl Results {
    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("cpu_util_total".into(), json!(self.cpu_util_total));
        m.insert("cpu_util_user".into(), json!(self.cpu_util_user));
        m.insert("cpu_util_system".into(), json!(self.cpu_util_system));
        m.insert(
            "sender_has_retransmits".into(),
            json!(self.sender_has_retransmits),
        );
        if let Some(cc) = &self.congestion_used {
            m.insert("congestion_used".into(), json!(cc));
        }
        if let Some(text) = &self.server_output_text {
            m.insert("server_output_text".into(), json!(text));
        }
        let streams: Vec<Value> = self
            .streams
            .iter()
            .map(|s| {
                json!({
                    "id": s.id,
                    "bytes": s.bytes,
                    "retransmits": s.retransmits,
                    "jitter": s.jitter,
                    "errors": s.errors,
                    "packets": s.packets,
                    "start_time": s.start_time,
                    "end_time": s.end_time,
                })
            })
            .collect();
        m.insert("streams".into(), Value::Array(streams));
        Value::Object(m)
    }

    /// Reads a peer's block; the fields iperf3 requires must be there.
    pub(crate) fn from_json(v: &Value) -> Result<Results, String> {
        let obj = v.as_object().ok_or("the results are not a JSON object")?;
        let float = |key: &str| -> Result<f64, String> {
            obj.get(key)
                .and_then(Value::as_f64)
                .ok_or_else(|| format!("results lack the number \"{key}\""))
        };
        let streams = obj
            .get("streams")
            .and_then(Value::as_array)
            .ok_or("results lack \"streams\"")?;
        let mut out = Results {
            cpu_util_total: float("cpu_util_total")?,
            cpu_util_user: float("cpu_util_user")?,
            cpu_util_system: float("cpu_util_system")?,
            sender_has_retransmits: obj
                .get("sender_has_retransmits")
                .and_then(int)
                .ok_or("results lack \"sender_has_retransmits\"")?,
            congestion_used: obj
                .get("congestion_used")
                .and_then(Value::as_str)
                .map(str::to_string),
            streams: Vec::with_capacity(streams.len()),
            server_output_text: obj
                .get("server_output_text")
                .and_then(Value::as_str)
                .map(str::to_string),
        };
        for (i, s) in streams.iter().enumerate() {
            let field = |key: &str| -> Result<i64, String> {
                s.get(key)
                    .and_then(int)
                    .ok_or_else(|| format!("stream entry {i} lacks the number \"{key}\""))
            };
            let id = field("id")?;
            out.streams.push(StreamResult {
                id: u32::try_from(id).map_err(|_| format!("stream entry {i} has id {id}"))?,
                bytes: field("bytes")?.max(0) as u64,
                retransmits: field("retransmits")?,
                jitter: s
                    .get("jitter")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| format!("stream entry {i} lacks \"jitter\""))?,
                errors: field("errors")?,
                packets: field("packets")?,
                start_time: s.get("start_time").and_then(Value::as_f64).unwrap_or(0.0),
                end_time: s.get("end_time").and_then(Value::as_f64).unwrap_or(0.0),
            });
        }
        Ok(out)
    }

    /// The entry of the stream at connection-order `index`, if present.
    pub(crate) fn stream(&self, index: u32) -> Option<&StreamResult> {
        let id = stream_id(index);
        self.streams.iter().find(|s| s.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_ids_skip_two_like_iperf3() {
        let ids: Vec<u32> = (0..4).map(stream_id).collect();
        assert_eq!(ids, vec![1, 3, 4, 5]);
        for i in 0..300 {
            assert_eq!(stream_index(stream_id(i) as u64), Some(i));
        }
        assert_eq!(stream_index(2), None);
        assert_eq!(stream_index(0), None);
    }

    #[test]
    fn a_3_12_servers_block_reads() {
        // Debian's iperf3 3.12 server, receiving: -1 printed unsigned.
        let v: Value = serde_json::from_str(
            r#"{"cpu_util_total":55.7,"cpu_util_user":1.5,"cpu_util_system":54.2,
                "sender_has_retransmits":1.8446744073709552e+19,"congestion_used":"cubic",
                "streams":[{"id":1,"bytes":1256194048,"retransmits":1.8446744073709552e+19,
                "jitter":0,"errors":0,"packets":0,"start_time":0,"end_time":1.000741},
                {"id":3,"bytes":1252392960,"retransmits":-1,"jitter":0,"errors":0,"packets":0,
                "start_time":0,"end_time":1.000748}]}"#,
        )
        .unwrap();
        let r = Results::from_json(&v).unwrap();
        assert_eq!(r.streams.len(), 2);
        assert_eq!(r.stream(1).unwrap().bytes, 1_252_392_960);
        assert_eq!(r.congestion_used.as_deref(), Some("cubic"));
        assert_eq!(r.sender_has_retransmits, -1);
        assert_eq!(r.stream(0).unwrap().retransmits, -1);
        let again = Results::from_json(&r.to_json()).unwrap();
        assert_eq!(again.streams, r.streams);
    }

    #[test]
    fn missing_fields_are_named() {
        let v = serde_json::json!({"cpu_util_total": 1, "cpu_util_user": 1,
            "cpu_util_system": 0, "sender_has_retransmits": 0,
            "streams": [{"id": 1, "bytes": 5}]});
        let e = Results::from_json(&v).unwrap_err();
        assert!(e.contains("retransmits"), "{e}");
        let e = Results::from_json(&serde_json::json!({"streams": []})).unwrap_err();
        assert!(e.contains("cpu_util_total"), "{e}");
    }
}
