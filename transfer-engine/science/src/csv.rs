//! CSV of serialized result cells: one header from the union of the
//! cells' flattened fields (`{cpu: {user_pct}}` becomes `cpu_user_pct`),
//! one line per cell, written by the csv crate (quoted where needed).

use serde::Serialize;
use serde_json::Value;

/// A field's text: an absent value empty, a string as it is (the csv
/// crate quotes it where needed), anything else as JSON writes it.
fn field_text(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Flattens `{a: {b: 1}}` into `a_b` columns.
fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, Value)>) {
    match v {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}_{k}")
                };
                flatten(&key, v, out);
            }
        }
        // An absent value (None) is an empty field, not a column of its own.
        Value::Null => {}
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// CSV of serialized cells: one header from the union of the flattened
/// fields (`first` in that order, then the others alphabetically), one
/// line per cell.
pub fn to_csv<T: Serialize>(cells: &[T], first: &[&str]) -> String {
    let rows: Vec<Vec<(String, Value)>> = cells
        .iter()
        .map(|c| {
            let mut row = Vec::new();
            flatten(
                "",
                &serde_json::to_value(c).unwrap_or(Value::Null),
                &mut row,
            );
            row
        })
        .collect();
    let mut rest: Vec<String> = Vec::new();
    for row in &rows {
        for (k, _) in row {
            if !first.contains(&k.as_str()) && !rest.contains(k) {
                rest.push(k.clone());
            }
        }
    }
    rest.sort();
    let mut header: Vec<String> = first
        .iter()
        .filter(|f| rows.iter().any(|r| r.iter().any(|(k, _)| k == *f)))
        .map(|f| f.to_string())
        .collect();
    header.extend(rest);
    let mut out = csv::Writer::from_writer(Vec::new());
    let mut write = |record: Vec<String>| {
        out.write_record(&record)
            .expect("a CSV record into memory cannot fail")
    };
    write(header.clone());
    for row in rows {
        write(
            header
                .iter()
                .map(|h| {
                    row.iter()
                        .find(|(k, _)| k == h)
                        .map(|(_, v)| field_text(v))
                        .unwrap_or_default()
                })
                .collect(),
        );
    }
    let bytes = out
        .into_inner()
        .expect("a CSV writer into memory cannot fail");
    String::from_utf8(bytes).expect("CSV of UTF-8 strings is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::CpuCell;

    #[test]
    fn csv_flattens_and_quotes() {
        #[derive(Serialize)]
        struct C {
            a: u32,
            cpu: Option<CpuCell>,
            error: Option<String>,
        }
        let cpu = CpuCell {
            user_pct: 1.0,
            system_pct: 2.0,
            softirq_pct: 3.0,
            process_seconds: 0.5,
        };
        let csv = to_csv(
            &[
                C {
                    a: 1,
                    cpu: Some(cpu),
                    error: None,
                },
                C {
                    a: 2,
                    cpu: None,
                    error: Some("x, \"y\"".into()),
                },
            ],
            &["a"],
        );
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "a,cpu_process_seconds,cpu_softirq_pct,cpu_system_pct,cpu_user_pct,error"
        );
        assert_eq!(lines[1], "1,0.5,3.0,2.0,1.0,");
        assert_eq!(lines[2], "2,,,,,\"x, \"\"y\"\"\"");
    }

    #[test]
    fn a_carriage_return_or_a_line_break_in_a_field_is_quoted() {
        #[derive(Serialize)]
        struct C {
            error: String,
        }
        let csv = to_csv(
            &[
                C {
                    error: "refused\r".into(),
                },
                C {
                    error: "two\nlines".into(),
                },
            ],
            &[],
        );
        assert_eq!(csv, "error\n\"refused\r\"\n\"two\nlines\"\n");
    }
}
