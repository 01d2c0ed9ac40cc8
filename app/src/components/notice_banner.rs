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
                    <code data-testid="one-time-secret">{secret.clone()}</code>
                    <CopyButton text=secret/>
                </p>
                <p class="hint">"Copy it now: it is shown only once and stored only as a hash."</p>
            })}
        </div>
    }
}

/// Copies `text` to the clipboard. Shown only once the page is hydrated:
/// without JavaScript the text is there to select.
#[island]
fn CopyButton(text: String) -> impl IntoView {
    let hydrated = RwSignal::new(false);
    let copied = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));
    let copy = move |_| {
        #[cfg(feature = "hydrate")]
        let _ = window().navigator().clipboard().write_text(&text);
        #[cfg(not(feature = "hydrate"))]
        let _ = &text;
        copied.set(true);
    };
    view! {
        <Show when=move || hydrated.get()>
            <button type="button" class="button button-quiet" on:click=copy.clone()>"Copy"</button>
        </Show>
        <span class="hint" aria-live="polite">{move || copied.get().then_some(" Copied.")}</span>
    }
}
