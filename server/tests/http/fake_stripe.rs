//! A small Stripe stand-in for faults no real fake produces on demand:
//! declines, 500s, answers slower than the proxy's timeout and answers
//! lost after the charge was made, chosen by the `customer` parameter. It
//! honours `Idempotency-Key` as Stripe does (the first result of a request
//! that ran is saved for 24 hours by a clock the test moves; a reused key
//! with other parameters is an `idempotency_error`; a request that failed
//! validation saves nothing), counts the money it took, and records what
//! reached it, so tests can check what the proxy forwarded (and what not).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
    routing::any,
    Json, Router,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

use crate::helpers::REAL_STRIPE_KEY;

/// One request as the fake received it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub authorization: String,
    pub idempotency_key: Option<String>,
    pub stripe_version: Option<String>,
    pub body: String,
}

/// A saved idempotent result: the request it answered, when, and the answer.
#[derive(Debug, Clone)]
struct Saved {
    request: String,
    at_hours: u64,
    status: StatusCode,
    body: Value,
}

#[derive(Default)]
struct Books {
    seen: Vec<Seen>,
    saved: HashMap<String, Saved>,
    /// Money taken: every charge made, once.
    charged_cents: i64,
    /// Each charge's amount by id.
    amounts: HashMap<String, i64>,
    charges: usize,
    /// The fake's clock, in hours since it started.
    now_hours: u64,
    /// Payment intents: id → (amount, status, capture manually).
    intents: HashMap<String, Intent>,
    /// Cancelling a payment intent answers 500 (Stripe unreachable for it).
    cancels_fail: bool,
}

#[derive(Debug, Clone)]
struct Intent {
    amount: i64,
    status: &'static str,
    manual_capture: bool,
}

#[derive(Clone, Default)]
pub struct FakeStripe {
    pub base: String,
    books: Arc<Mutex<Books>>,
    /// `customer=cus_hold` waits here until [`FakeStripe::release`].
    hold: Arc<Notify>,
}

impl FakeStripe {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Self {
            base: format!("http://{}", listener.local_addr().unwrap()),
            ..Self::default()
        };
        let app = Router::new()
            .route("/v1/{*rest}", any(answer))
            .with_state(fake.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        fake
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.books.lock().unwrap().seen.clone()
    }

    /// The money Stripe took, and in how many charges.
    pub fn charged(&self) -> (i64, usize) {
        let books = self.books.lock().unwrap();
        (books.charged_cents, books.charges)
    }

    /// The amount of the charge with this id, if the fake made it.
    pub fn amount_of(&self, id: &str) -> Option<i64> {
        self.books.lock().unwrap().amounts.get(id).copied()
    }

    /// Moves the fake's clock: saved idempotent results older than 24
    /// hours are forgotten, as Stripe prunes them.
    pub fn advance_hours(&self, hours: u64) {
        self.books.lock().unwrap().now_hours += hours;
    }

    /// Whether cancelling a payment intent fails with a 500 from now on.
    pub fn fail_cancels(&self, fail: bool) {
        self.books.lock().unwrap().cancels_fail = fail;
    }

    /// A payment intent's status.
    pub fn intent_status(&self, id: &str) -> Option<&'static str> {
        self.books.lock().unwrap().intents.get(id).map(|i| i.status)
    }

    /// Lets a held call (`customer=cus_hold`) answer.
    pub fn release(&self) {
        self.hold.notify_one();
    }
}

async fn answer(
    State(fake): State<FakeStripe>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let body = String::from_utf8_lossy(&body).into_owned();
    let idempotency_key = header("idempotency-key");
    // Stripe compares parameters, not their order.
    let mut pairs: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    pairs.sort();
    let request = format!("{method} {} {pairs:?}", uri.path());
    let number = {
        let mut books = fake.books.lock().unwrap();
        books.seen.push(Seen {
            method: method.to_string(),
            path: uri.path().to_owned(),
            authorization: header("authorization").unwrap_or_default(),
            idempotency_key: idempotency_key.clone(),
            stripe_version: header("stripe-version"),
            body: body.clone(),
        });
        books.seen.len()
    };
    if header("authorization").as_deref() != Some(&format!("Bearer {REAL_STRIPE_KEY}")) {
        let error = json!({ "error": { "type": "invalid_request_error", "message": "Invalid API Key provided" } });
        return (StatusCode::UNAUTHORIZED, Json(error)).into_response();
    }
    if let Some(key) = &idempotency_key {
        let mut books = fake.books.lock().unwrap();
        let now = books.now_hours;
        books.saved.retain(|_, saved| now < saved.at_hours + 24);
        if let Some(saved) = books.saved.get(key) {
            if saved.request != request {
                let error = json!({ "error": { "type": "idempotency_error",
                    "message": "Keys for idempotent requests can only be used with the same parameters they were first used with." } });
                return (StatusCode::BAD_REQUEST, Json(error)).into_response();
            }
            let mut response = (saved.status, Json(saved.body.clone())).into_response();
            response
                .headers_mut()
                .insert("idempotent-replayed", "true".parse().unwrap());
            return response;
        }
    }
    let params: Vec<(String, String)> = form_urlencoded::parse(body.as_bytes())
        .into_owned()
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let amount: i64 = param("amount")
        .and_then(|a| a.parse().ok())
        .unwrap_or_default();
    if uri.path().starts_with("/v1/payment_intents") {
        return payment_intent(&fake, uri.path(), &param, amount, number);
    }
    // A result Stripe keeps under the Idempotency-Key (a request that ran).
    let save = |books: &mut Books, status: StatusCode, body: &Value| {
        if let Some(key) = &idempotency_key {
            let at_hours = books.now_hours;
            let saved = Saved {
                request: request.clone(),
                at_hours,
                status,
                body: body.clone(),
            };
            books.saved.insert(key.clone(), saved);
        }
    };
    // Runs the request: a charge is made (and its result saved under the
    // Idempotency-Key) unless the customer says otherwise.
    let charge = |id: String| {
        let charge = json!({ "id": id, "object": "charge", "amount": param("amount") });
        let mut books = fake.books.lock().unwrap();
        if amount > 0 {
            books.charged_cents += amount;
            books.charges += 1;
            books.amounts.insert(id.clone(), amount);
        }
        save(&mut books, StatusCode::OK, &charge);
        charge
    };
    let save_failure = |status: StatusCode, body: Value| {
        save(&mut fake.books.lock().unwrap(), status, &body);
        (status, Json(body)).into_response()
    };
    match param("customer").as_deref() {
        Some("cus_decline") => {
            let error = json!({ "error": { "type": "card_error", "code": "card_declined", "message": "Your card was declined." } });
            save_failure(StatusCode::PAYMENT_REQUIRED, error)
        }
        // Validation fails: Stripe saves nothing under the key.
        Some("cus_missing") => {
            let error = json!({ "error": { "type": "invalid_request_error", "code": "resource_missing",
                                           "message": "No such customer: 'cus_missing'" } });
            (StatusCode::NOT_FOUND, Json(error)).into_response()
        }
        Some("cus_500") => save_failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({ "error": { "type": "api_error" } }),
        ),
        Some("cus_slow") => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            (StatusCode::OK, Json(json!({ "id": "ch_late" }))).into_response()
        }
        // The charge is made and saved, and the answer never arrives in time.
        Some("cus_lost") => {
            charge(format!("ch_lost{number}"));
            tokio::time::sleep(Duration::from_secs(5)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        Some("cus_hold") => {
            fake.hold.notified().await;
            Json(charge(format!("ch_held{number}"))).into_response()
        }
        _ => {
            let charge = charge(format!("ch_fake{number}"));
            ([("request-id", format!("req_fake{number}"))], Json(charge)).into_response()
        }
    }
}

/// Payment intents as Stripe runs them: a declined confirmation leaves the
/// intent alive (`requires_payment_method`, named in the error), it can be
/// confirmed again, cancelled, or captured for at most its amount.
fn payment_intent(
    fake: &FakeStripe,
    path: &str,
    param: &dyn Fn(&str) -> Option<String>,
    amount: i64,
    number: usize,
) -> Response {
    let mut books = fake.books.lock().unwrap();
    let declines = param("payment_method").as_deref() == Some("pm_card_chargeCustomerFail");
    let object = |id: &str, intent: &Intent| {
        Json(json!({ "id": id, "object": "payment_intent", "amount": intent.amount, "status": intent.status }))
            .into_response()
    };
    let invalid = |message: &str| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({ "error": { "type": "invalid_request_error", "message": message } })),
        )
            .into_response()
    };
    let rest = path.trim_start_matches("/v1/payment_intents");
    if rest.is_empty() {
        let id = format!("pi_fake{number}");
        let mut intent = Intent {
            amount,
            status: "requires_confirmation",
            manual_capture: param("capture_method").as_deref() == Some("manual"),
        };
        if param("confirm").as_deref() == Some("true") {
            if declines {
                intent.status = "requires_payment_method";
                books.intents.insert(id.clone(), intent);
                let error = json!({ "error": { "type": "card_error", "code": "card_declined",
                    "payment_intent": { "id": id, "status": "requires_payment_method" } } });
                return (StatusCode::PAYMENT_REQUIRED, Json(error)).into_response();
            }
            confirm(&mut books, &mut intent);
        }
        books.intents.insert(id.clone(), intent.clone());
        return object(&id, &intent);
    }
    let rest = rest.trim_start_matches('/');
    let (id, step) = rest.split_once('/').unwrap_or((rest, ""));
    let cancels_fail = books.cancels_fail;
    let Some(mut intent) = books.intents.get(id).cloned() else {
        return invalid("No such payment_intent");
    };
    match step {
        "" => {
            if amount > 0 {
                intent.amount = amount;
            }
        }
        "confirm" if intent.status != "canceled" && intent.status != "succeeded" => {
            if declines {
                intent.status = "requires_payment_method";
            } else {
                confirm(&mut books, &mut intent);
            }
        }
        "capture" if intent.status == "requires_capture" => {
            let capture = param("amount_to_capture")
                .and_then(|a| a.parse().ok())
                .unwrap_or(intent.amount);
            books.charged_cents += capture;
            books.charges += 1;
            intent.status = "succeeded";
        }
        "cancel" if cancels_fail => {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                Json(json!({ "error": { "type": "api_error" } })),
            )
                .into_response()
        }
        "cancel" if intent.status != "succeeded" => intent.status = "canceled",
        _ => return invalid("This PaymentIntent's status does not allow that"),
    }
    books.intents.insert(id.to_owned(), intent.clone());
    object(id, &intent)
}

fn confirm(books: &mut Books, intent: &mut Intent) {
    if intent.manual_capture {
        intent.status = "requires_capture";
    } else {
        books.charged_cents += intent.amount;
        books.charges += 1;
        intent.status = "succeeded";
    }
}
