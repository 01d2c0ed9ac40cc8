//! The period close page's forms (prepare, withdraw: operator; sign off:
//! approver) and the signed report's CSV pack, a zip streamed as it is
//! written: the report's tables, the exact signed JSON with its SHA-256,
//! and the period's calls from the audit log.

use std::io::{self, Write};

use axum::{
    body::{Body, Bytes},
    extract::{rejection::FormRejection, Path, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    Extension, Form,
};
use futures::TryStreamExt;
use serde::Deserialize;
use tokio::sync::mpsc;
use tower_sessions::Session;
use zip::{write::SimpleFileOptions, CompressionMethod, ZipWriter};

use super::{
    busy::{Busy, HeavyWork},
    error::HttpError,
    forms::{readable, Failure, Page},
    guard::Operator,
};
use app::{
    actions::sql as actions,
    audit::{csv as audit_csv, sql as audit},
    domain::{BillingPeriod, Notice},
    error::AppError,
    periods::{pack as period_pack, rules as period_close, sql as period_closes},
    ssr::AppState,
};

/// The form's one field: a note for the approver (prepare).
#[derive(Debug, Deserialize)]
pub struct CloseForm {
    #[serde(default)]
    note: String,
}

/// The period in the path, or the close page's "no such period".
fn period_of(raw: &str) -> Result<BillingPeriod, Failure> {
    raw.parse::<BillingPeriod>()
        .map_err(|_| Failure::App(AppError::NotFound))
}

/// Where the forms answer: back to the period's close page (the overview
/// when the path names no period).
fn page(raw: &str) -> (Page, String) {
    let back = match raw.parse::<BillingPeriod>() {
        Ok(period) => format!("/periods/{period}"),
        Err(_) => "/".to_owned(),
    };
    (
        Page {
            path: "/",
            gone: "There is no such billing period.",
        },
        back,
    )
}

pub async fn prepare(
    State(state): State<AppState>,
    Operator { me, actor, .. }: Operator,
    session: Session,
    Path(raw): Path<String>,
    form: Result<Form<CloseForm>, FormRejection>,
) -> Response {
    let (page, back) = page(&raw);
    let outcome = async {
        let form = readable(form)?;
        let period = period_of(&raw)?;
        period_close::prepare(&state.pool, &me, actor, period, &form.note).await?;
        Ok(Notice::success(format!(
            "The close of {period} is prepared: an approver other than you signs it off."
        )))
    }
    .await;
    page.back_to(&back, &session, outcome).await
}

pub async fn withdraw(
    State(state): State<AppState>,
    Operator { me, actor, .. }: Operator,
    session: Session,
    Path(raw): Path<String>,
) -> Response {
    let (page, back) = page(&raw);
    let outcome = async {
        let period = period_of(&raw)?;
        period_close::withdraw(&state.pool, &me, actor, period).await?;
        Ok(Notice::success(format!(
            "The close of {period} was withdrawn: the period is open again."
        )))
    }
    .await;
    page.back_to(&back, &session, outcome).await
}

pub async fn sign_off(
    State(state): State<AppState>,
    Operator { me, actor, .. }: Operator,
    session: Session,
    Path(raw): Path<String>,
) -> Response {
    let (page, back) = page(&raw);
    let outcome = async {
        let period = period_of(&raw)?;
        let signed = period_close::sign_off(&state.pool, &me, actor, period).await?;
        Ok(Notice::success(format!(
            "{period} is signed off: {} key(s) revoked, report SHA-256 {}.",
            signed.keys_revoked, signed.report_sha256
        )))
    }
    .await;
    page.back_to(&back, &session, outcome).await
}

/// Rows of the calls file waiting for the zip writer, at most.
const ROWS_IN_FLIGHT: usize = 1024;
/// Compressed chunks waiting for a slow client, at most.
const CHUNKS_IN_FLIGHT: usize = 16;
/// Bytes the zip writer gathers before it sends a chunk.
const CHUNK: usize = 64 * 1024;

/// `GET /periods/{period}/close-pack.zip`: the signed report as a zip of
/// CSV files. Memory stays flat whatever the period's size: the calls
/// stream from PostgreSQL's COPY through the zip writer (on a blocking
/// thread) into the response.
pub async fn pack(
    State(state): State<AppState>,
    Extension(heavy): Extension<HeavyWork>,
    Operator { actor, .. }: Operator,
    Path(raw): Path<String>,
) -> Response {
    let slot = match heavy.export() {
        Ok(slot) => slot,
        Err(Busy(message)) => {
            return HttpError::new(StatusCode::SERVICE_UNAVAILABLE, message).into_response()
        }
    };
    let signed = async {
        let period = raw
            .parse::<BillingPeriod>()
            .map_err(|_| AppError::NotFound)?;
        let close = period_closes::live(&state.pool, period)
            .await?
            .filter(|close| close.signed_at.is_some())
            .ok_or_else(|| {
                AppError::Invalid(format!(
                    "{period} is not signed off: its pack is made from the signed report"
                ))
            })?;
        let (text, sha256) = period_closes::signed_report(&state.pool, close.id)
            .await?
            .ok_or(AppError::NotFound)?;
        let (report, _) = period_close::frozen(&text, &sha256)?;
        Ok::<_, AppError>((close, report, text, sha256))
    }
    .await;
    let (close, report, text, sha256) = match signed {
        Ok(signed) => signed,
        Err(err) => return HttpError::from(err).into_response(),
    };
    let files = match period_pack::files(&report, &close) {
        Ok(files) => files,
        Err(err) => {
            tracing::error!(error = %err, "could not write a close pack");
            return HttpError::from(AppError::Internal).into_response();
        }
    };
    let period = report.period;
    let (rows_in, rows_out) = mpsc::channel::<Bytes>(ROWS_IN_FLIGHT);
    let (chunks, mut body) = mpsc::channel::<Result<Bytes, io::Error>>(CHUNKS_IN_FLIGHT);
    let copy = audit::export_copy(&period_pack::calls_filter(&report));
    let reads = state.reads.pool.clone();
    let rows = tokio::spawn(async move {
        let mut conn = reads.acquire().await?;
        let mut stream = conn.copy_out_raw(&copy).await?;
        let mut sent = 0u64;
        while let Some(row) = stream.try_next().await? {
            if rows_in.send(row).await.is_err() {
                // The zip writer stopped (the client went away) mid-COPY:
                // this connection is never handed to anyone else.
                drop(stream);
                drop(conn.detach());
                break;
            }
            sent += 1;
        }
        Ok::<_, sqlx::Error>(sent)
    });
    let zip_chunks = chunks.clone();
    let zipped = tokio::task::spawn_blocking(move || {
        write_zip(
            files,
            (&text, &sha256),
            rows_out,
            io::BufWriter::with_capacity(CHUNK, ChannelWriter(zip_chunks)),
        )
    });
    let primary = state.pool.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let zipped = zipped.await.map_err(io::Error::other).and_then(|r| r);
        let calls = rows
            .await
            .map_err(io::Error::other)
            .and_then(|r| r.map_err(io::Error::other));
        let outcome = match (zipped, calls) {
            (Ok(()), Ok(calls)) => Ok(calls),
            (Err(err), _) | (_, Err(err)) => Err(err),
        };
        if let Err(err) = &outcome {
            tracing::error!(error = %err, "a close pack failed");
            let _ = chunks.send(Err(io::Error::other("the pack failed"))).await;
        }
        let details = serde_json::json!({
            "close_id": close.id, "calls": outcome.as_ref().ok(), "failed": outcome.is_err(),
        });
        if let Err(err) = actions::record(
            &primary,
            actor,
            "period.export_pack",
            "billing_period",
            Some(period.to_string()),
            details,
        )
        .await
        {
            tracing::error!(error = %err, "could not record a close pack download");
        }
    });
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/zip".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"vaultcap-close-{period}.zip\""),
            ),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
        Body::from_stream(futures::stream::poll_fn(move |cx| body.poll_recv(cx))),
    )
        .into_response()
}

/// Writes the pack: the report's tables, the signed JSON and its hash (in
/// `sha256sum` form, so `sha256sum -c report.sha256` checks it), then the
/// calls as the rows arrive.
fn write_zip(
    files: Vec<(&'static str, Vec<u8>)>,
    (report, sha256): (&str, &str),
    mut rows: mpsc::Receiver<Bytes>,
    out: impl Write,
) -> io::Result<()> {
    let mut zip = ZipWriter::new_stream(out);
    let options = SimpleFileOptions::default().compression_method(CompressionMethod::Deflated);
    let signed = [
        ("report.json", report.as_bytes().to_vec()),
        (
            "report.sha256",
            format!("{sha256}  report.json\n").into_bytes(),
        ),
    ];
    for (name, bytes) in files.into_iter().chain(signed) {
        zip.start_file(name, options)?;
        zip.write_all(&bytes)?;
    }
    zip.start_file("calls.csv", options.large_file(true))?;
    zip.write_all(audit_csv::HEADER.join(",").as_bytes())?;
    zip.write_all(b"\n")?;
    while let Some(row) = rows.blocking_recv() {
        zip.write_all(&row)?;
    }
    zip.finish()?.flush()
}

/// The response body as a `Write`: each write is a chunk for the client,
/// waited for when the client is slow; gone once the client is.
struct ChannelWriter(mpsc::Sender<Result<Bytes, io::Error>>);

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
