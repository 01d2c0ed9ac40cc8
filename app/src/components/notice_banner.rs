use leptos::prelude::*;

use crate::domain::{Notice, NoticeKind};

/// The one-time notice after a form submission; a secret in it (a generated
/// password) is shown once, selectable, with a warning.
#[component]
pub fn NoticeBanner(notice: Notice) -> impl IntoView {
    let (class, role) = match notice.kind {
        NoticeKind::Success => ("notice notice-success", "status"),
        NoticeKind::Error => ("notice notice-error", "alert"),
    };
    view! {
        <div class=class role=role>
            <p>{notice.message}</p>
            {notice.secret.map(|secret| view! {
                <p class="secret">
                    <code data-testid="one-time-secret">{secret}</code>
                </p>
                <p class="hint">"Copy it now: it is shown only once and stored only as a hash."</p>
            })}
        </div>
    }
}
