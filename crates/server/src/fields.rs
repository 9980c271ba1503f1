//! A JSON request body read field by field, and the errors that name a field: a wrong type, a
//! value out of range, a field whose meaning this server does not serve.
//!
//! `null` counts as absent (clients send it for "default").

use serde_json::{Map, Value};

use crate::error::ApiError;

/// A JSON object read field by field.
pub struct Fields<'a>(pub &'a Map<String, Value>);

/// How an error names the JSON type a field was given.
pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl<'a> Fields<'a> {
    pub fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    pub fn f32(&self, name: &str) -> Result<Option<f32>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN) as f32;
                if x.is_finite() {
                    Ok(Some(x))
                } else {
                    Err(ApiError::invalid(name, format!("`{name}` must be a finite number")))
                }
            }
            Some(v) => Err(ApiError::invalid(name, format!("`{name}` must be a number, got {}", type_name(v)))),
        }
    }

    pub fn i64(&self, name: &str) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(i) => Ok(Some(i)),
                None if n.as_u64().is_some() => Err(ApiError::invalid(name, format!("`{name}` is too large, got {n}"))),
                None => Err(ApiError::invalid(name, format!("`{name}` must be an integer, got {n}"))),
            },
            Some(v) => Err(ApiError::invalid(name, format!("`{name}` must be an integer, got {}", type_name(v)))),
        }
    }

    /// An integer in `lo..=hi`.
    pub fn int_in(&self, name: &str, lo: i64, hi: i64) -> Result<Option<i64>, ApiError> {
        match self.i64(name)? {
            Some(i) if i < lo || i > hi => {
                Err(ApiError::invalid(name, format!("`{name}` must be in [{lo}, {hi}], got {i}")))
            }
            other => Ok(other),
        }
    }

    pub fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(ApiError::invalid(name, format!("`{name}` must be a boolean, got {}", type_name(v)))),
        }
    }

    pub fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(ApiError::invalid(name, format!("`{name}` must be a string, got {}", type_name(v)))),
        }
    }

    pub fn object(&self, name: &str) -> Result<Option<Fields<'a>>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(Fields(o))),
            Some(v) => Err(ApiError::invalid(name, format!("`{name}` must be an object, got {}", type_name(v)))),
        }
    }
}

/// A field of the wrong JSON type.
pub(crate) fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(param, format!("`{param}` must be {want}, got {}", type_name(got)))
}

/// A field whose meaning this server does not serve: `what` says what is not supported.
pub(crate) fn unsupported(param: &str, what: &str) -> ApiError {
    ApiError::invalid(param, format!("`{param}`: {what} not supported by this server"))
}
