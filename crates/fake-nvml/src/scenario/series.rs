//! Values over simulated time: constants, ramps, bursts, CSV traces and live files, with their
//! values and exact integrals, and how a scenario file writes one.

use std::path::Path;

use serde::Deserialize;

use super::parse::secs;

/// A value over simulated time.
#[derive(Debug, Clone, PartialEq)]
pub enum Series {
    Constant(f64),
    /// Linear from `from` to `to` over `over` seconds, starting at `start`, then holds `to`.
    Ramp {
        from: f64,
        to: f64,
        start: f64,
        over: f64,
    },
    /// `busy` for the first `duty` fraction of every `period`, `idle` for the rest.
    Bursts {
        busy: f64,
        idle: f64,
        period: f64,
        duty: f64,
    },
    /// Linear interpolation between `(t, value)` points; holds the last value after the end.
    Trace(Vec<(f64, f64)>),
    /// The number in a file, read at every call, so that a test can drive a reading directly
    /// (and await its effect) instead of racing a clock. Unreadable means 0.
    Live(std::path::PathBuf),
}

impl Series {
    pub fn at(&self, t: f64) -> f64 {
        match self {
            Series::Constant(v) => *v,
            Series::Ramp {
                from,
                to,
                start,
                over,
            } => {
                if t <= *start {
                    *from
                } else if t >= start + over {
                    *to
                } else {
                    from + (to - from) * (t - start) / over
                }
            }
            Series::Bursts {
                busy,
                idle,
                period,
                duty,
            } => {
                let phase = t.rem_euclid(*period) / period;
                if phase < *duty {
                    *busy
                } else {
                    *idle
                }
            }
            Series::Trace(points) => trace_at(points, t),
            Series::Live(path) => std::fs::read_to_string(path)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0),
        }
    }

    /// The integral of the series from 0 to `t` (value × seconds).
    pub fn integral(&self, t: f64) -> f64 {
        if t <= 0.0 {
            return 0.0;
        }
        match self {
            Series::Constant(v) => v * t,
            Series::Ramp {
                from,
                to,
                start,
                over,
            } => {
                let before = from * t.min(*start);
                let ramp_t = (t - start).clamp(0.0, *over);
                let during = from * ramp_t + (to - from) * ramp_t * ramp_t / (2.0 * over);
                let after = to * (t - start - over).max(0.0);
                before + during + after
            }
            Series::Bursts {
                busy,
                idle,
                period,
                duty,
            } => {
                let per_period = period * (duty * busy + (1.0 - duty) * idle);
                let whole = (t / period).floor();
                let rest = t - whole * period;
                let busy_part = rest.min(duty * period);
                whole * per_period + busy_part * busy + (rest - busy_part) * idle
            }
            Series::Trace(points) => trace_integral(points, t),
            // Not integrable after the fact: the current value over the whole time.
            Series::Live(_) => self.at(t) * t,
        }
    }
}

fn trace_at(points: &[(f64, f64)], t: f64) -> f64 {
    match points.iter().position(|(pt, _)| *pt > t) {
        None => points.last().map_or(0.0, |p| p.1),
        Some(0) => points[0].1,
        Some(i) => {
            let (t0, v0) = points[i - 1];
            let (t1, v1) = points[i];
            v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        }
    }
}

fn trace_integral(points: &[(f64, f64)], t: f64) -> f64 {
    let Some(&(first_t, first_v)) = points.first() else {
        return 0.0;
    };
    // Before the first point the trace holds its first value.
    let mut total = first_v * first_t.min(t);
    for pair in points.windows(2) {
        let (t0, v0) = pair[0];
        let (t1, _) = pair[1];
        if t <= t0 {
            return total;
        }
        let end = t.min(t1);
        let v_end = trace_at(points, end);
        total += (v0 + v_end) / 2.0 * (end - t0);
    }
    let (last_t, last_v) = points[points.len() - 1];
    total + last_v * (t - last_t).max(0.0)
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawSeries {
    Value(f64),
    Shape(RawShape),
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(super) enum RawShape {
    Constant {
        value: f64,
    },
    Ramp {
        from: f64,
        to: f64,
        over: String,
        #[serde(default)]
        start: Option<String>,
    },
    Bursts {
        busy: f64,
        idle: f64,
        period: String,
        duty: f64,
    },
    Trace {
        file: String,
    },
    Live {
        file: String,
    },
}

impl RawSeries {
    pub(super) fn validate(self, key: &str, base: &Path) -> Result<Series, String> {
        Ok(match self {
            RawSeries::Value(v) | RawSeries::Shape(RawShape::Constant { value: v }) => {
                Series::Constant(v)
            }
            RawSeries::Shape(RawShape::Ramp {
                from,
                to,
                over,
                start,
            }) => {
                let over = secs(&format!("{key}.over"), &over)?;
                if over <= 0.0 {
                    return Err(format!("{key}.over: must be greater than zero"));
                }
                let start = match start {
                    Some(s) => secs(&format!("{key}.start"), &s)?,
                    None => 0.0,
                };
                Series::Ramp {
                    from,
                    to,
                    start,
                    over,
                }
            }
            RawSeries::Shape(RawShape::Bursts {
                busy,
                idle,
                period,
                duty,
            }) => {
                let period = secs(&format!("{key}.period"), &period)?;
                if period <= 0.0 {
                    return Err(format!("{key}.period: must be greater than zero"));
                }
                if !(0.0..=1.0).contains(&duty) {
                    return Err(format!("{key}.duty: \"{duty}\" is not between 0 and 1"));
                }
                Series::Bursts {
                    busy,
                    idle,
                    period,
                    duty,
                }
            }
            RawSeries::Shape(RawShape::Live { file }) => Series::Live(base.join(file)),
            RawSeries::Shape(RawShape::Trace { file }) => {
                let path = base.join(&file);
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{key}.file: \"{file}\" cannot be read: {e}"))?;
                Series::Trace(
                    parse_trace(&text).map_err(|e| format!("{key}.file: \"{file}\": {e}"))?,
                )
            }
        })
    }
}

/// Parses a CSV trace of `seconds,value` lines. A header line and `#` comments are skipped.
pub fn parse_trace(text: &str) -> Result<Vec<(f64, f64)>, String> {
    let mut points = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut cols = line.split(',').map(str::trim);
        let (Some(t), Some(v)) = (cols.next(), cols.next()) else {
            return Err(format!("line {}: expected \"seconds,value\"", n + 1));
        };
        match (t.parse::<f64>(), v.parse::<f64>()) {
            (Ok(t), Ok(v)) => {
                if points.last().is_some_and(|&(pt, _)| t <= pt) {
                    return Err(format!("line {}: time \"{t}\" does not increase", n + 1));
                }
                points.push((t, v));
            }
            _ if points.is_empty() && n == 0 => continue, // header
            _ => return Err(format!("line {}: \"{line}\" is not two numbers", n + 1)),
        }
    }
    if points.is_empty() {
        return Err("no data points".to_string());
    }
    Ok(points)
}
