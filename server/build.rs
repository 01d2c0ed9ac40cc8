// `sqlx::migrate!` embeds the migrations at compile time; without this a
// new or edited migration is not picked up until something else changes.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
