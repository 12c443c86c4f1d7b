//! A reading's value, and the conversions from base units to dcgm-exporter's.

use std::fmt;

use prometheus_client::encoding::{
    CounterValueEncoder, EncodeCounterValue, EncodeGaugeValue, GaugeValueEncoder,
};

/// A reading's value. Integers stay integers on the wire (`7`, not `7.0`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
}

impl Value {
    fn f64(self) -> f64 {
        match self {
            Value::Int(v) => v as f64,
            Value::Float(v) => v,
        }
    }
}

impl EncodeGaugeValue for Value {
    fn encode(&self, e: &mut GaugeValueEncoder) -> Result<(), fmt::Error> {
        match *self {
            Value::Int(v) => EncodeGaugeValue::encode(&v, e),
            Value::Float(v) => EncodeGaugeValue::encode(&v, e),
        }
    }
}

impl EncodeCounterValue for Value {
    fn encode(&self, e: &mut CounterValueEncoder) -> Result<(), fmt::Error> {
        match *self {
            Value::Int(v) => EncodeCounterValue::encode(&v.max(0).unsigned_abs(), e),
            Value::Float(v) => EncodeCounterValue::encode(&v, e),
        }
    }
}

pub(super) fn int<T: Into<u64>>(v: Option<T>) -> Option<Value> {
    v.map(|v| Value::Int(v.into() as i64))
}

pub(super) fn float(v: Option<f64>) -> Option<Value> {
    v.map(Value::Float)
}

/// A yes or no as 1 or 0.
pub(super) fn flag(v: Option<bool>) -> Option<Value> {
    v.map(|b| Value::Int(i64::from(b)))
}

const MIB: f64 = 1024.0 * 1024.0;

pub(super) fn same(v: Value) -> Value {
    v
}

/// A ratio from NVML's whole percent back to the percent it was.
pub(super) fn percent(v: Value) -> Value {
    Value::Int((v.f64() * 100.0).round() as i64)
}

pub(super) fn mib(v: Value) -> Value {
    Value::Int((v.f64() / MIB).floor() as i64)
}

pub(super) fn rounded(v: Value) -> Value {
    Value::Int(v.f64().round() as i64)
}

pub(super) fn milli(v: Value) -> Value {
    Value::Int((v.f64() * 1000.0).round() as i64)
}

pub(super) fn mega(v: Value) -> Value {
    Value::Int((v.f64() / 1e6).round() as i64)
}

pub(super) fn micro(v: Value) -> Value {
    Value::Int((v.f64() * 1e6).round() as i64)
}

pub(super) fn kib(v: Value) -> Value {
    Value::Int((v.f64() / 1024.0).floor() as i64)
}
