//! The console's tables of records: headed columns, numbers right-aligned,
//! scrolling sideways on their own (by keyboard too) rather than the page.

use leptos::prelude::*;

/// A column heading, and whether its figures are right-aligned.
pub struct Column {
    label: &'static str,
    numeric: bool,
}

/// A column of words.
pub const fn col(label: &'static str) -> Column {
    Column {
        label,
        numeric: false,
    }
}

/// A column of figures, right-aligned.
pub const fn num(label: &'static str) -> Column {
    Column {
        label,
        numeric: true,
    }
}

/// `rows` (the `<tr>`s) under `columns`, in a `<table class=class>`. The
/// caption names the table to screen readers; `caption_shown` shows it.
#[component]
pub fn DataTable(
    class: &'static str,
    columns: Vec<Column>,
    children: Children,
    #[prop(optional)] caption: Option<&'static str>,
    #[prop(optional)] caption_shown: bool,
    #[prop(optional)] testid: Option<&'static str>,
) -> impl IntoView {
    let caption = caption.map(|text| {
        if caption_shown {
            view! { <caption>{text}</caption> }.into_any()
        } else {
            view! { <caption class="visually-hidden">{text}</caption> }.into_any()
        }
    });
    let headings = columns
        .into_iter()
        .map(|Column { label, numeric }| {
            if numeric {
                view! { <th scope="col" class="num">{label}</th> }.into_any()
            } else {
                view! { <th scope="col">{label}</th> }.into_any()
            }
        })
        .collect_view();
    view! {
        <div class="table-scroll" tabindex="0">
            <table class=class data-testid=testid>
                {caption}
                <thead><tr>{headings}</tr></thead>
                <tbody>{children()}</tbody>
            </table>
        </div>
    }
}
