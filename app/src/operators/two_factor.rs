//! The optional second factor, as the two-factor page shows it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// An authenticator waiting to be confirmed with its first code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enrollment {
    /// The shared secret in base32, in groups of four, to type in by hand.
    pub secret: String,
    /// The `otpauth://` URI the QR code holds.
    pub uri: String,
    /// The QR code, as an SVG document.
    pub qr_svg: String,
}

/// One operator's second factor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TwoFactorView {
    /// Whether their role may use one (approvers and admins).
    pub offered: bool,
    /// When it was turned on; `None` while sign-in asks for a password only.
    pub enabled_at: Option<DateTime<Utc>>,
    pub recovery_codes_left: i64,
    pub enrollment: Option<Enrollment>,
}
