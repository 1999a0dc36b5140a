//! Rebuilds the binary when a migration is added: `sqlx::migrate!` embeds the directory's files
//! at compile time, and cargo otherwise notices only changes to the files it already embedded.

fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
