//! The domain types as PostgreSQL columns: a row is read straight into
//! them, and a value the database holds that is not one (a period
//! `2026-13`, a currency `US$`) is an error naming the column and the value,
//! never a default.

use sqlx::{
    encode::IsNull,
    error::BoxDynError,
    postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef},
    Decode, Encode, Postgres, Type,
};

use super::{
    ApplyAs, BillingPeriod, Cents, Currency, Decision, DuplicatePolicy, FindingKind, ParseError,
    RequestState,
};

/// A type stored as text: read with `$parse`, written as `$write` gives it.
macro_rules! text_column {
    ($ty:ty, $what:literal, $parse:expr, $write:expr) => {
        impl Type<Postgres> for $ty {
            fn type_info() -> PgTypeInfo {
                <String as Type<Postgres>>::type_info()
            }

            fn compatible(ty: &PgTypeInfo) -> bool {
                <String as Type<Postgres>>::compatible(ty)
            }
        }

        impl<'r> Decode<'r, Postgres> for $ty {
            fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                let raw = <&str as Decode<Postgres>>::decode(value)?;
                let parse: fn(&str) -> Result<$ty, ParseError> = $parse;
                parse(raw).map_err(|err| format!("{raw:?} is not {}: {err}", $what).into())
            }
        }

        impl Encode<'_, Postgres> for $ty {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                let write: fn(&$ty) -> String = $write;
                <String as Encode<Postgres>>::encode_by_ref(&write(self), buf)
            }
        }
    };
}

text_column!(
    BillingPeriod,
    "a billing period",
    |raw| raw.parse(),
    |period| period.to_string()
);
text_column!(Currency, "a currency", Currency::parse_stored, |currency| {
    currency.as_str().to_owned()
});
text_column!(
    DuplicatePolicy,
    "a duplicate policy",
    DuplicatePolicy::parse,
    |policy| policy.as_str().to_owned()
);
text_column!(
    Decision,
    "a decision",
    |raw| Decision::parse(raw).ok_or_else(|| ParseError::new("unknown decision")),
    |decision| decision.as_str().to_owned()
);

text_column!(
    FindingKind,
    "a kind of finding",
    |raw| FindingKind::parse(raw).ok_or_else(|| ParseError::new("unknown kind")),
    |kind| kind.as_str().to_owned()
);

text_column!(
    ApplyAs,
    "a way to apply an increase",
    ApplyAs::parse,
    |apply| { apply.as_str().to_owned() }
);
text_column!(
    RequestState,
    "a request's state",
    |raw| RequestState::parse(raw).ok_or_else(|| ParseError::new("unknown state")),
    |state| state.as_str().to_owned()
);

/// Cents are a `bigint`.
impl Type<Postgres> for Cents {
    fn type_info() -> PgTypeInfo {
        <i64 as Type<Postgres>>::type_info()
    }
}

impl<'r> Decode<'r, Postgres> for Cents {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        <i64 as Decode<Postgres>>::decode(value).map(Cents)
    }
}

impl Encode<'_, Postgres> for Cents {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <i64 as Encode<Postgres>>::encode_by_ref(&self.0, buf)
    }
}
