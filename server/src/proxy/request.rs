//! One reading of a call, the one Stripe would make from the same bytes.
//!
//! Stripe reads form bodies with Rack's nested-parameter parser: `;` may
//! separate pairs, a repeated scalar name keeps its last value, brackets
//! that do not nest are read in ways `form_urlencoded` does not share. A
//! call whose bytes two parsers could read differently could be metered as
//! one thing and charged as another, so anything outside the plain shape
//! every Stripe SDK sends is refused here, before any reservation. What is
//! forwarded is then exactly what was metered.

use axum::http::{header, HeaderMap, HeaderName, Method, Uri};
use percent_encoding::percent_decode;
use sha2::{Digest, Sha256};

use super::stripe_error::StripeError;
use app::domain::Cents;

/// Stripe's limit on an Idempotency-Key.
pub const MAX_IDEMPOTENCY_KEY: usize = 255;
/// Stripe's metadata limits.
pub const MAX_METADATA_KEYS: usize = 50;
pub const MAX_METADATA_KEY_CHARS: usize = 40;
pub const MAX_METADATA_VALUE_CHARS: usize = 500;

/// Headers Stripe acts on: each may be sent once at most.
const SINGLE_HEADERS: [HeaderName; 5] = [
    header::AUTHORIZATION,
    header::CONTENT_TYPE,
    HeaderName::from_static("idempotency-key"),
    HeaderName::from_static("stripe-account"),
    HeaderName::from_static("stripe-version"),
];

/// The method and path as Stripe routes them: exactly `GET` or `POST` (a
/// method's case matters to HTTP, not to every check that reads it), and a
/// path without `.` or `..` segments or escapes, which an HTTP client may
/// resolve into another path than the one the endpoint check allowed.
pub fn check_target(method: &Method, uri: &Uri) -> Result<(), StripeError> {
    if method != Method::GET && method != Method::POST {
        return Err(StripeError::invalid_request(format!(
            "Stripe's API takes GET and POST here, not {method}"
        )));
    }
    let path = uri.path();
    if path.contains('%')
        || path
            .split('/')
            .any(|segment| segment == "." || segment == "..")
    {
        return Err(StripeError::invalid_request(format!(
            "the path {path:?} holds escapes or dot segments; send the plain path"
        )));
    }
    Ok(())
}

/// The headers a call is decided on, each present at most once and readable.
#[derive(Debug, Clone, Default)]
pub struct CallHeaders {
    pub idempotency_key: Option<String>,
    pub stripe_account: Option<String>,
}

impl CallHeaders {
    pub fn read(headers: &HeaderMap) -> Result<Self, StripeError> {
        if let Some(name) = SINGLE_HEADERS
            .iter()
            .find(|name| headers.get_all(*name).iter().count() > 1)
        {
            return Err(StripeError::invalid_request(format!(
                "the {name} header was sent more than once; send it once"
            )));
        }
        let idempotency_key = single_header(headers, "idempotency-key")?;
        if let Some(key) = &idempotency_key {
            if key.is_empty() {
                return Err(StripeError::invalid_request(
                    "the Idempotency-Key header is empty".to_owned(),
                ));
            }
            if key.chars().count() > MAX_IDEMPOTENCY_KEY {
                return Err(StripeError::invalid_request(format!(
                    "the Idempotency-Key is {} characters long; Stripe allows at most {MAX_IDEMPOTENCY_KEY}",
                    key.chars().count()
                )));
            }
        }
        let stripe_account = single_header(headers, "stripe-account")?;
        single_header(headers, "stripe-version")?;
        Ok(Self {
            idempotency_key,
            stripe_account,
        })
    }
}

/// A header's value as text without control characters (`None` when absent).
fn single_header(headers: &HeaderMap, name: &str) -> Result<Option<String>, StripeError> {
    let Some(value) = headers.get(name) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(text) if !text.chars().any(char::is_control) => Ok(Some(text.to_owned())),
        _ => Err(StripeError::invalid_request(format!(
            "the {name} header holds control or non-ASCII characters"
        ))),
    }
}

/// A request's parameters as Stripe reads them: the form body of a write,
/// the query of a read. Names are unique except for array entries (`[]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn read(
        method: &Method,
        uri: &Uri,
        headers: &HeaderMap,
        body: &[u8],
    ) -> Result<Self, StripeError> {
        let raw = if method == Method::GET {
            if !body.is_empty() {
                return Err(StripeError::invalid_request(
                    "a GET request carries no body; send its parameters in the query".to_owned(),
                ));
            }
            uri.query().unwrap_or("").as_bytes()
        } else {
            if uri.query().is_some() {
                return Err(StripeError::invalid_request(format!(
                    "{method} parameters go in the form body, not the query string"
                )));
            }
            if body.is_empty() {
                return Ok(Self(Vec::new()));
            }
            let form = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
            if !form {
                return Err(StripeError::not_form_encoded());
            }
            body
        };
        Self::parse(raw).map_err(StripeError::invalid_request)
    }

    /// Reads `a=1&b%5Bc%5D=2`, refusing whatever Stripe's parser could read
    /// another way.
    fn parse(raw: &[u8]) -> Result<Self, String> {
        if raw.contains(&b';') {
            return Err("`;` separates parameters for Stripe's parser: encode it as %3B".into());
        }
        let mut params: Vec<(String, String)> = Vec::new();
        for pair in raw.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
            let (name, value) = match pair.iter().position(|b| *b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, &b""[..]),
            };
            let name = decode(name)?;
            let value = decode(value)?;
            check_name(&name)?;
            if let Some(bad) = value
                .chars()
                .find(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
            {
                return Err(format!(
                    "parameter `{name}` holds the control character U+{:04X}",
                    bad as u32
                ));
            }
            if !name.ends_with("[]") && params.iter().any(|(seen, _)| *seen == name) {
                return Err(format!(
                    "parameter `{name}` was given more than once; Stripe would read only the last"
                ));
            }
            params.push((name, value));
        }
        let params = Self(params);
        params.check_metadata()?;
        Ok(params)
    }

    fn check_metadata(&self) -> Result<(), String> {
        let mut keys = 0;
        for (name, value) in &self.0 {
            let Some(key) = name
                .strip_prefix("metadata[")
                .and_then(|rest| rest.strip_suffix(']'))
            else {
                if name == "metadata" && !value.is_empty() {
                    return Err("`metadata` takes keys: metadata[name]=value".into());
                }
                continue;
            };
            if key.contains(['[', ']']) || key.is_empty() {
                return Err(format!("`{name}`: metadata takes one level of plain keys"));
            }
            keys += 1;
            if keys > MAX_METADATA_KEYS {
                return Err(format!(
                    "more than {MAX_METADATA_KEYS} metadata keys; Stripe allows {MAX_METADATA_KEYS}"
                ));
            }
            if key.chars().count() > MAX_METADATA_KEY_CHARS {
                return Err(format!(
                    "metadata key `{key}` is longer than {MAX_METADATA_KEY_CHARS} characters"
                ));
            }
            if value.chars().count() > MAX_METADATA_VALUE_CHARS {
                return Err(format!(
                    "metadata value of `{key}` is longer than {MAX_METADATA_VALUE_CHARS} characters"
                ));
            }
        }
        Ok(())
    }

    /// A parameter's value, if given.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The amount a call moves: one `amount` of whole cents, written as
    /// Stripe writes integers (no sign, no spaces, no leading zeros).
    pub fn amount(&self) -> Result<Cents, StripeError> {
        let Some(raw) = self.get("amount") else {
            return Err(StripeError::invalid_amount(
                "missing: a charge needs an `amount` in cents",
            ));
        };
        Self::whole_cents(raw, "amount")
    }

    /// A positive amount of cents as Stripe writes integers (no sign, no
    /// spaces, no leading zeros); `name` is the parameter, for the error.
    pub fn whole_cents(raw: &str, name: &str) -> Result<Cents, StripeError> {
        let plain =
            !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) && !raw.starts_with('0');
        if !plain {
            return Err(StripeError::invalid_amount(&format!(
                "{name} {raw:?} is not a whole number of cents written in digits"
            )));
        }
        Cents::parse_positive(raw).map_err(|err| StripeError::invalid_amount(&err.0))
    }

    /// What makes two calls the same request for Stripe's idempotency:
    /// method, path, connected account and every parameter (order-free
    /// between names, in order within an array).
    pub fn fingerprint(
        &self,
        method: &Method,
        path: &str,
        stripe_account: Option<&str>,
    ) -> Vec<u8> {
        let mut sorted: Vec<&(String, String)> = self.0.iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        let mut hash = Sha256::new();
        let mut field = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_be_bytes());
            hash.update(bytes);
        };
        field(method.as_str().as_bytes());
        field(path.trim_end_matches('/').as_bytes());
        field(stripe_account.unwrap_or("").as_bytes());
        for (name, value) in sorted {
            field(name.as_bytes());
            field(value.as_bytes());
        }
        hash.finalize().to_vec()
    }
}

/// `+` is a space; every `%` starts two hex digits; the result is UTF-8.
fn decode(raw: &[u8]) -> Result<String, String> {
    let spaced: Vec<u8> = raw
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    for (at, _) in spaced.iter().enumerate().filter(|(_, b)| **b == b'%') {
        let hex = spaced.get(at + 1..at + 3);
        if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
            return Err("a `%` not followed by two hex digits".into());
        }
    }
    percent_decode(&spaced)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| "a parameter is not UTF-8 once decoded".into())
}

/// Stripe's parameter names: `name`, `name[key]`, `name[key][]`, … where
/// `name` is letters, digits and `_`, and a key holds no brackets.
fn check_name(name: &str) -> Result<(), String> {
    let base_end = name.find('[').unwrap_or(name.len());
    let (base, mut rest) = name.split_at(base_end);
    let plain_base =
        !base.is_empty() && base.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let bad = || {
        Err(format!(
            "parameter name {name:?} is not one Stripe reads as written"
        ))
    };
    if !plain_base {
        return bad();
    }
    while !rest.is_empty() {
        let Some(inner) = rest.strip_prefix('[') else {
            return bad();
        };
        let Some(close) = inner.find(']') else {
            return bad();
        };
        let key = &inner[..close];
        if key.contains('[') || key.chars().any(char::is_control) {
            return bad();
        }
        rest = &inner[close + 1..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<Params, String> {
        Params::parse(raw.as_bytes())
    }

    #[test]
    fn the_shapes_stripe_sdks_send_are_read() {
        let params = parse(
            "amount=1000&currency=usd&metadata%5Bcustomer_id%5D=c+1&expand%5B%5D=a&expand%5B%5D=b\
             &items%5B0%5D%5Bprice%5D=p&description=line%0Aline",
        )
        .unwrap();
        assert_eq!(params.get("amount"), Some("1000"));
        assert_eq!(params.get("metadata[customer_id]"), Some("c 1"));
        assert_eq!(params.get("description"), Some("line\nline"));
        assert_eq!(params.amount().unwrap(), Cents(1000));
    }

    #[test]
    fn names_and_bytes_another_parser_would_read_differently_are_refused() {
        for bad in [
            "amount=1;amount=2",
            "amount=100&amount=5000",
            "amount%5D=1",
            "metadata%5Bcustomer_id=1",
            "metadata%5Ba%5D%5Bb%5D=1",
            "meta+data=1",
            "amount=%zz",
            "amount=%4",
            "amount=%ff",
            "metadata%5Bc%5D=a%00b",
            "metadata%5Bc%00%5D=1",
            "metadata=x",
            "=5",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was read");
        }
    }

    #[test]
    fn metadata_is_held_to_stripes_limits() {
        let fifty: String = (0..50).map(|n| format!("metadata%5Bk{n}%5D=v&")).collect();
        assert!(parse(&fifty).is_ok());
        assert!(parse(&format!("{fifty}metadata%5Bone_more%5D=v")).is_err());
        assert!(parse(&format!("metadata%5B{}%5D=v", "k".repeat(40))).is_ok());
        assert!(parse(&format!("metadata%5B{}%5D=v", "k".repeat(41))).is_err());
        assert!(parse(&format!("metadata%5Bk%5D={}", "v".repeat(500))).is_ok());
        assert!(parse(&format!("metadata%5Bk%5D={}", "v".repeat(501))).is_err());
    }

    #[test]
    fn an_amount_is_plain_digits() {
        for (raw, ok) in [
            ("1000", true),
            ("+1000", false),
            ("01000", false),
            ("%201000", false),
            ("1e3", false),
            ("0", false),
        ] {
            let params = parse(&format!("amount={raw}")).unwrap();
            assert_eq!(params.amount().is_ok(), ok, "{raw}");
        }
    }

    #[test]
    fn the_fingerprint_ignores_name_order_but_not_values_account_or_array_order() {
        let post = Method::POST;
        let fp = |raw: &str, account: Option<&str>| {
            parse(raw)
                .unwrap()
                .fingerprint(&post, "/v1/charges", account)
        };
        let base = fp("amount=100&currency=usd", None);
        assert_eq!(base, fp("currency=usd&amount=100", None));
        assert_ne!(base, fp("amount=101&currency=usd", None));
        assert_ne!(base, fp("amount=100&currency=usd", Some("acct_1")));
        assert_ne!(
            fp("expand%5B%5D=a&expand%5B%5D=b", None),
            fp("expand%5B%5D=b&expand%5B%5D=a", None)
        );
    }

    #[test]
    fn headers_stripe_acts_on_are_sent_once_and_bounded() {
        let mut headers = HeaderMap::new();
        headers.insert("idempotency-key", "k".repeat(255).parse().unwrap());
        assert!(CallHeaders::read(&headers).is_ok());
        headers.insert("idempotency-key", "k".repeat(256).parse().unwrap());
        assert!(CallHeaders::read(&headers).is_err());
        let mut twice = HeaderMap::new();
        twice.append("idempotency-key", "a".parse().unwrap());
        twice.append("idempotency-key", "b".parse().unwrap());
        assert!(CallHeaders::read(&twice).is_err());
        let mut account = HeaderMap::new();
        account.append("stripe-account", "acct_1".parse().unwrap());
        account.append("stripe-account", "acct_2".parse().unwrap());
        assert!(CallHeaders::read(&account).is_err());
    }
}
