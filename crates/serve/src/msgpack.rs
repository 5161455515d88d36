//! openpi's msgpack-numpy encoding (`openpi_client/msgpack_numpy.py`, openpi-client 0.1.2).
//!
//! A NumPy array travels as a msgpack map whose keys are msgpack *bin* strings:
//! `{b"__ndarray__": True, b"data": <raw bytes>, b"dtype": "<f4", b"shape": [d0, d1, ..]}`, and a
//! NumPy scalar as `{b"__npgeneric__": True, b"data": <value>, b"dtype": "<i8"}`. Python's
//! unpacker finds them with `b"__ndarray__" in obj`, so the bin (not str) keys matter when we
//! encode; when we decode we accept either. Plain msgpack numbers and nested lists are accepted
//! too, for clients without NumPy.

use rmpv::Value;

use crate::error::RequestError;

/// Element type of a transported array (NumPy's `dtype.str` without the byte order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    /// `f2`, `f4`, `f8`.
    Float(usize),
    /// `i1` .. `i8`.
    Int(usize),
    /// `u1` .. `u8`.
    Uint(usize),
    /// `b1`.
    Bool,
}

impl DType {
    fn size(self) -> usize {
        match self {
            DType::Float(n) | DType::Int(n) | DType::Uint(n) => n,
            DType::Bool => 1,
        }
    }

    /// NumPy's name for it, e.g. `float32`, `uint8`.
    pub fn name(self) -> String {
        match self {
            DType::Float(n) => format!("float{}", n * 8),
            DType::Int(n) => format!("int{}", n * 8),
            DType::Uint(n) => format!("uint{}", n * 8),
            DType::Bool => "bool".into(),
        }
    }
}

/// A decoded n-dimensional array: shape, element type, little-endian bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct NdArray {
    /// Shape (empty for a scalar).
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// Row-major elements as little-endian bytes (`shape.product() * size` of them).
    pub data: Vec<u8>,
}

/// Whether a map key equals `name` (str or bin).
pub fn key_is(key: &Value, name: &str) -> bool {
    key_bytes(key) == Some(name.as_bytes())
}

/// A map key's bytes (str or bin keys); None for other key types.
pub fn key_bytes(key: &Value) -> Option<&[u8]> {
    match key {
        Value::String(s) => Some(s.as_bytes()),
        Value::Binary(b) => Some(b),
        _ => None,
    }
}

/// A map key as text for error messages.
pub fn key_text(key: &Value) -> String {
    match key_bytes(key) {
        Some(b) => String::from_utf8_lossy(b).into_owned(),
        None => key.to_string(),
    }
}

/// The value under `name` in a map's entries.
pub fn get<'a>(map: &'a [(Value, Value)], name: &str) -> Option<&'a Value> {
    map.iter().find(|(k, _)| key_is(k, name)).map(|(_, v)| v)
}

fn parse_dtype(s: &str, field: &str) -> Result<(DType, bool), RequestError> {
    let bad = || RequestError::new(field, format!("unsupported dtype {s:?}"));
    let (big_endian, rest) = match s.as_bytes().first() {
        Some(b'<' | b'|' | b'=') => (false, &s[1..]),
        Some(b'>') => (true, &s[1..]),
        _ => (false, s),
    };
    let mut chars = rest.chars();
    let kind = chars.next().ok_or_else(bad)?;
    let size: usize = chars.as_str().parse().map_err(|_| bad())?;
    let dtype = match (kind, size) {
        ('f', 2 | 4 | 8) => DType::Float(size),
        ('i', 1 | 2 | 4 | 8) => DType::Int(size),
        ('u', 1 | 2 | 4 | 8) => DType::Uint(size),
        ('b', 1) => DType::Bool,
        _ => return Err(bad()),
    };
    Ok((dtype, big_endian && size > 1))
}

impl NdArray {
    /// Decodes an `__ndarray__` map (None when `v` is not one).
    pub fn from_value(v: &Value, field: &str) -> Result<Option<Self>, RequestError> {
        let Value::Map(m) = v else { return Ok(None) };
        if get(m, "__ndarray__").is_none() {
            return Ok(None);
        }
        let need = |name: &str| {
            get(m, name).ok_or_else(|| {
                RequestError::new(field, format!("an __ndarray__ map without {name:?}"))
            })
        };
        let dtype = match need("dtype")? {
            Value::String(s) => s.as_str().unwrap_or_default().to_owned(),
            Value::Binary(b) => String::from_utf8_lossy(b).into_owned(),
            other => return Err(RequestError::new(field, format!("dtype is {other}"))),
        };
        let (dtype, swap) = parse_dtype(&dtype, field)?;
        let shape = match need("shape")? {
            Value::Array(a) => a
                .iter()
                .map(|d| d.as_u64().map(|d| d as usize))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| RequestError::new(field, "shape holds a non-integer"))?,
            other => return Err(RequestError::new(field, format!("shape is {other}"))),
        };
        let Value::Binary(data) = need("data")? else {
            return Err(RequestError::new(field, "data is not a byte string"));
        };
        let n = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| RequestError::new(field, "shape overflows"))?;
        if n.checked_mul(dtype.size()) != Some(data.len()) {
            return Err(RequestError::new(
                field,
                format!(
                    "shape {shape:?} of {} needs {} bytes, data has {}",
                    dtype.name(),
                    n * dtype.size(),
                    data.len()
                ),
            ));
        }
        let mut data = data.clone();
        if swap {
            for el in data.chunks_mut(dtype.size()) {
                el.reverse();
            }
        }
        Ok(Some(Self { shape, dtype, data }))
    }

    /// Elements as f64 (any numeric dtype).
    pub fn to_f64(&self) -> Vec<f64> {
        let s = self.dtype.size();
        self.data
            .chunks(s)
            .map(|b| match (self.dtype, s) {
                (DType::Float(_), 2) => f16_to_f64(u16::from_le_bytes([b[0], b[1]])),
                (DType::Float(_), 4) => f64::from(f32::from_le_bytes(b.try_into().unwrap())),
                (DType::Float(_), _) => f64::from_le_bytes(b.try_into().unwrap()),
                (DType::Int(_), _) => sign_extend(b) as f64,
                (DType::Uint(_) | DType::Bool, _) => {
                    let mut w = [0u8; 8];
                    w[..s].copy_from_slice(b);
                    u64::from_le_bytes(w) as f64
                }
            })
            .collect()
    }

    /// A float32 array.
    pub fn from_f32(shape: &[usize], values: &[f32]) -> Self {
        Self {
            shape: shape.to_vec(),
            dtype: DType::Float(4),
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    /// The `__ndarray__` map Python's `unpackb` turns back into an array.
    pub fn to_value(&self) -> Value {
        let dtype = match self.dtype {
            DType::Float(n) => format!("<f{n}"),
            DType::Int(n) => format!("<i{n}"),
            DType::Uint(1) => "|u1".into(),
            DType::Uint(n) => format!("<u{n}"),
            DType::Bool => "|b1".into(),
        };
        Value::Map(vec![
            (Value::Binary(b"__ndarray__".to_vec()), Value::Boolean(true)),
            (
                Value::Binary(b"data".to_vec()),
                Value::Binary(self.data.clone()),
            ),
            (Value::Binary(b"dtype".to_vec()), Value::from(dtype)),
            (
                Value::Binary(b"shape".to_vec()),
                Value::Array(self.shape.iter().map(|&d| Value::from(d as u64)).collect()),
            ),
        ])
    }
}

fn sign_extend(b: &[u8]) -> i64 {
    let mut w = if b.last().is_some_and(|x| x & 0x80 != 0) {
        [0xffu8; 8]
    } else {
        [0u8; 8]
    };
    w[..b.len()].copy_from_slice(b);
    i64::from_le_bytes(w)
}

fn f16_to_f64(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((h >> 10) & 0x1f);
    let frac = f64::from(h & 0x3ff);
    sign * match exp {
        0 => frac * 2f64.powi(-24),
        31 if frac == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        e => (1.0 + frac / 1024.0) * 2f64.powi(e - 15),
    }
}

/// A numeric field: an `__ndarray__`, an `__npgeneric__` scalar, a plain number or nested
/// lists of numbers. Returns (shape, values).
pub fn numeric(v: &Value, field: &str) -> Result<(Vec<usize>, Vec<f64>), RequestError> {
    if let Some(a) = NdArray::from_value(v, field)? {
        return Ok((a.shape.clone(), a.to_f64()));
    }
    if let Value::Map(m) = v
        && get(m, "__npgeneric__").is_some()
    {
        let data = get(m, "data")
            .ok_or_else(|| RequestError::new(field, "an __npgeneric__ map without \"data\""))?;
        return numeric(data, field);
    }
    fn walk(v: &Value, depth: usize, shape: &mut Vec<usize>, out: &mut Vec<f64>) -> bool {
        match v {
            Value::Array(items) => {
                if shape.len() == depth {
                    shape.push(items.len());
                } else if shape[depth] != items.len() {
                    return false;
                }
                items.iter().all(|x| walk(x, depth + 1, shape, out))
            }
            // A number where a list was expected (ragged nesting).
            _ if depth < shape.len() => false,
            Value::F32(x) => {
                out.push(f64::from(*x));
                true
            }
            Value::F64(x) => {
                out.push(*x);
                true
            }
            Value::Integer(i) => {
                out.push(i.as_f64().unwrap_or(f64::NAN));
                true
            }
            _ => false,
        }
    }
    let (mut shape, mut out) = (Vec::new(), Vec::new());
    if walk(v, 0, &mut shape, &mut out) && out.len() == shape.iter().product::<usize>() {
        Ok((shape, out))
    } else {
        Err(RequestError::new(
            field,
            format!(
                "expected a numeric array (numpy array or nested lists of numbers), got {}",
                describe(v)
            ),
        ))
    }
}

/// A short description of a value's type for error messages.
pub fn describe(v: &Value) -> String {
    match v {
        Value::Nil => "nil".into(),
        Value::Boolean(_) => "a boolean".into(),
        Value::Integer(_) | Value::F32(_) | Value::F64(_) => "a number".into(),
        Value::String(_) => "a string".into(),
        Value::Binary(b) => format!("{} raw bytes", b.len()),
        Value::Array(a) => format!("a ragged or non-numeric list of {}", a.len()),
        Value::Map(m) => format!("a map with {} keys", m.len()),
        Value::Ext(..) => "a msgpack extension".into(),
    }
}

/// Decodes one msgpack value and checks nothing follows it.
pub fn decode(bytes: &[u8]) -> Result<Value, RequestError> {
    let mut rd = bytes;
    let v = rmpv::decode::read_value(&mut rd)
        .map_err(|e| RequestError::new("request", format!("not valid msgpack: {e}")))?;
    if !rd.is_empty() {
        return Err(RequestError::new(
            "request",
            format!("{} bytes after the msgpack value", rd.len()),
        ));
    }
    Ok(v)
}

/// Encodes a value.
pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("writing msgpack to a Vec cannot fail");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(dtype: &str, shape: &[u64], data: Vec<u8>) -> Value {
        Value::Map(vec![
            (Value::Binary(b"__ndarray__".to_vec()), Value::Boolean(true)),
            (Value::Binary(b"data".to_vec()), Value::Binary(data)),
            (Value::Binary(b"dtype".to_vec()), Value::from(dtype)),
            (
                Value::Binary(b"shape".to_vec()),
                Value::Array(shape.iter().map(|&d| Value::from(d)).collect()),
            ),
        ])
    }

    #[test]
    fn decodes_numpy_dtypes() {
        let f4 = arr(
            "<f4",
            &[2],
            [1.5f32, -2.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        );
        assert_eq!(numeric(&f4, "x").unwrap(), (vec![2], vec![1.5, -2.0]));
        let f8 = arr(">f8", &[1], 3.25f64.to_be_bytes().to_vec());
        assert_eq!(numeric(&f8, "x").unwrap().1, vec![3.25]);
        let i2 = arr(
            "<i2",
            &[2],
            [-3i16, 7].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        assert_eq!(numeric(&i2, "x").unwrap().1, vec![-3.0, 7.0]);
        let u1 = arr("|u1", &[2, 1], vec![0, 255]);
        assert_eq!(numeric(&u1, "x").unwrap(), (vec![2, 1], vec![0.0, 255.0]));
        // 1.0 and -0.5 in half precision.
        let f2 = arr("<f2", &[2], vec![0x00, 0x3c, 0x00, 0xb8]);
        assert_eq!(numeric(&f2, "x").unwrap().1, vec![1.0, -0.5]);
    }

    #[test]
    fn plain_lists_and_scalars_are_numbers_too() {
        let v = Value::Array(vec![
            Value::Array(vec![Value::from(1), Value::F64(2.5)]),
            Value::Array(vec![Value::F32(3.0), Value::from(-4)]),
        ]);
        assert_eq!(
            numeric(&v, "x").unwrap(),
            (vec![2, 2], vec![1.0, 2.5, 3.0, -4.0])
        );
        assert_eq!(numeric(&Value::from(7), "x").unwrap(), (vec![], vec![7.0]));
        let ragged = Value::Array(vec![
            Value::Array(vec![Value::from(1)]),
            Value::Array(vec![Value::from(1), Value::from(2)]),
        ]);
        assert!(numeric(&ragged, "x").is_err());
        assert!(numeric(&Value::from("a"), "x").is_err());
        let generic = Value::Map(vec![
            (
                Value::Binary(b"__npgeneric__".to_vec()),
                Value::Boolean(true),
            ),
            (Value::Binary(b"data".to_vec()), Value::from(42)),
            (Value::Binary(b"dtype".to_vec()), Value::from("<i8")),
        ]);
        assert_eq!(numeric(&generic, "seed").unwrap().1, vec![42.0]);
    }

    #[test]
    fn bad_arrays_say_what_is_wrong() {
        let short = arr("<f4", &[3], vec![0; 8]);
        let e = numeric(&short, "observation.state")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("observation.state") && e.contains("12 bytes"),
            "{e}"
        );
        let odd = arr("<c8", &[1], vec![0; 8]);
        assert!(
            numeric(&odd, "x")
                .unwrap_err()
                .to_string()
                .contains("dtype")
        );
    }

    #[test]
    fn encoded_arrays_use_bin_keys_and_round_trip() {
        let a = NdArray::from_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let v = a.to_value();
        let Value::Map(m) = &v else { panic!() };
        assert!(m.iter().all(|(k, _)| matches!(k, Value::Binary(_))));
        let back = decode(&encode(&v)).unwrap();
        assert_eq!(NdArray::from_value(&back, "a").unwrap().unwrap(), a);
    }

    #[test]
    fn garbage_and_trailing_bytes_are_errors() {
        assert!(
            decode(&[0x92, 0x01])
                .unwrap_err()
                .to_string()
                .contains("not valid msgpack")
        );
        let mut b = encode(&Value::from(1));
        b.push(0);
        assert!(decode(&b).unwrap_err().to_string().contains("after"));
    }
}
