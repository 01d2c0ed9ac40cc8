//! `vaultcap serve` as a user starts it: the real binary, no DATABASE_URL,
//! a private PostgreSQL cluster from the machine's binaries.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    os::unix::fs::PermissionsExt,
    process::{Command, Stdio},
};

#[test]
fn serve_without_a_database_url_runs_a_private_cluster_and_stops_it_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // Run as root, PostgreSQL runs as the postgres user, who must get in.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut serve = Command::new(env!("CARGO_BIN_EXE_vaultcap"))
        .args(["serve", "--addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env_remove("DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let mut stdout = BufReader::new(serve.stdout.take().unwrap()).lines();
    let first = stdout.next().unwrap().unwrap();
    assert!(
        first.starts_with("First start: created the admin admin@localhost with password "),
        "{first}"
    );
    let _warning = stdout.next().unwrap().unwrap();
    let url_line = stdout.next().unwrap().unwrap();
    let address = url_line
        .strip_prefix("Vaultcap console: http://")
        .expect(&url_line)
        .to_owned();

    let mut health = TcpStream::connect(&address).unwrap();
    health
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    health.read_to_string(&mut response).unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") && response.ends_with("ok"),
        "{response}"
    );

    let pid_file = dir.path().join("postgres/postmaster.pid");
    assert!(pid_file.exists(), "the private cluster is running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = serve.wait().unwrap();
    assert!(status.success(), "serve exits cleanly: {status}");
    assert!(!pid_file.exists(), "the private cluster was stopped");
}
