//! Conformance check: the official Azure IoT Operations Rust SDK
//! (`azure_iot_operations_services`, features `state_store` and `leased_lock`)
//! against a running dsslock `statestore`.
//!
//! The connection comes from the `AIO_*` environment variables, as
//! docs/sdk-guide.md tells SDK users to set them (`run.sh` sets them). Each of
//! the three clients uses `AIO_MQTT_CLIENT_ID` with a suffix (`-a`, `-b`, `-c`).
//!
//! Every step waits on a response or a notification, each bounded by a
//! deadline. On the first mismatch the program prints what it expected and
//! what it got, and exits with status 1.

use std::sync::Arc;
use std::time::{Duration, Instant};

use azure_iot_operations_mqtt::aio::connection_settings::MqttConnectionSettingsBuilder;
use azure_iot_operations_mqtt::session::{Session, SessionExitHandle, SessionOptionsBuilder};
use azure_iot_operations_protocol::application::ApplicationContextBuilder;
use azure_iot_operations_protocol::common::hybrid_logical_clock::HybridLogicalClock;
use azure_iot_operations_services::leased_lock::lock;
use azure_iot_operations_services::state_store::{self, KeyObservation, Operation, SetCondition, SetOptions};
use tokio::task::JoinHandle;

type Res<T> = Result<T, String>;

/// The SDK's request timeout (it rounds up to whole seconds).
const REQ: Duration = Duration::from_secs(10);
/// How long one expected notification or connection may take.
const WAIT: Duration = Duration::from_secs(10);
/// The leased lock's expiry and auto-renewal period.
const LOCK_TTL: Duration = Duration::from_secs(1);
const RENEW: Duration = Duration::from_millis(250);
/// Renewals the observer must see while the second client waits: at least
/// 1.5 s, so the lock outlives its first expiry only through renewals.
const RENEWALS: usize = 6;

/// One MQTT session with a state store client on it.
struct Conn {
    id: String,
    ss: Arc<state_store::Client>,
    exit: SessionExitHandle,
    run: JoinHandle<()>,
}

/// Fails the check with `msg` unless `ok`.
fn ensure(ok: bool, msg: impl FnOnce() -> String) -> Res<()> {
    if ok {
        Ok(())
    } else {
        Err(msg())
    }
}

/// The order of two HLC versions: wall time, then counter.
fn newer(a: &HybridLogicalClock, b: &HybridLogicalClock) -> bool {
    (a.timestamp, a.counter) > (b.timestamp, b.counter)
}

fn version(what: &str, v: Option<HybridLogicalClock>) -> Res<HybridLogicalClock> {
    v.ok_or_else(|| format!("{what}: the response has no version (__ts)"))
}

async fn connect(suffix: &str) -> Res<Conn> {
    let base = std::env::var("AIO_MQTT_CLIENT_ID").unwrap_or_else(|_| "dsslock-rust-check".into());
    let id = format!("{base}-{suffix}");
    let settings = MqttConnectionSettingsBuilder::from_environment()
        .map_err(|e| format!("AIO_* environment: {e}"))?
        .client_id(id.clone())
        .build()
        .map_err(|e| format!("connection settings: {e}"))?;
    let options = SessionOptionsBuilder::default()
        .connection_settings(settings)
        .build()
        .map_err(|e| format!("session options: {e}"))?;
    let session = Session::new(options).map_err(|e| format!("session: {e}"))?;
    let monitor = session.create_session_monitor();
    let ss = state_store::Client::new(
        ApplicationContextBuilder::default().build().map_err(|e| e.to_string())?,
        session.create_managed_client(),
        session.create_session_monitor(),
        state_store::ClientOptionsBuilder::default().build().map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("state store client: {e}"))?;
    let exit = session.create_exit_handle();
    let run = tokio::spawn(async move {
        if let Err(e) = session.run().await {
            eprintln!("session ended with an error: {e}");
        }
    });
    tokio::time::timeout(WAIT, monitor.connected()).await.map_err(|_| {
        format!(
            "{id}: no MQTT connection to {}:{} within {WAIT:?}",
            std::env::var("AIO_BROKER_HOSTNAME").unwrap_or_default(),
            std::env::var("AIO_BROKER_TCP_PORT").unwrap_or_default()
        )
    })?;
    Ok(Conn { id, ss: Arc::new(ss), exit, run })
}

/// The next notification of an observation, within WAIT.
async fn next(obs: &mut KeyObservation, what: &str) -> Res<state_store::KeyNotification> {
    match tokio::time::timeout(WAIT, obs.recv_notification()).await {
        Ok(Some((n, _))) => Ok(n),
        Ok(None) => Err(format!("{what}: the observation closed")),
        Err(_) => Err(format!("{what}: no notification within {WAIT:?}")),
    }
}

/// A notification, readable: operation, value, key, version.
fn show(n: &state_store::KeyNotification) -> String {
    let op = match &n.operation {
        Operation::Set(v) => format!("SET({})", String::from_utf8_lossy(v)),
        Operation::Del => "DELETE".into(),
    };
    format!("{op} of {} at {}", String::from_utf8_lossy(&n.key), n.version)
}

fn is_set(n: &state_store::KeyNotification, value: &[u8]) -> bool {
    matches!(&n.operation, Operation::Set(v) if v == value)
}

/// SET, GET, DEL and VDEL on one client.
async fn crud(a: &Conn) -> Res<()> {
    let ss = &a.ss;
    let key = format!("{}/crud", a.id).into_bytes();
    let e = |what: &'static str| move |err: state_store::Error| format!("{what}: {err}");
    let uncond = SetOptions::default();

    let r = ss.set(key.clone(), b"v1".to_vec(), REQ, None, uncond.clone()).await.map_err(e("SET v1"))?;
    ensure(r.response, || "SET v1: not applied".into())?;
    let v1 = version("SET v1", r.version)?;

    let r = ss.get(key.clone(), REQ).await.map_err(e("GET"))?;
    ensure(r.response.as_deref() == Some(b"v1".as_slice()), || format!("GET: want v1, got {:?}", r.response))?;
    let gv = version("GET", r.version)?;
    ensure(gv == v1, || format!("GET: version {gv}, want the SET's {v1}"))?;

    let r = ss.set(key.clone(), b"v2".to_vec(), REQ, None, uncond.clone()).await.map_err(e("SET v2"))?;
    let v2 = version("SET v2", r.version)?;
    ensure(r.response && newer(&v2, &v1), || {
        format!("SET v2: applied {} version {v2}, want applied and newer than {v1}", r.response)
    })?;

    let nx = SetOptions { set_condition: SetCondition::OnlyIfDoesNotExist, ..Default::default() };
    let r = ss.set(key.clone(), b"v3".to_vec(), REQ, None, nx).await.map_err(e("SET NX"))?;
    ensure(!r.response, || "SET NX of an existing key: applied, want not applied".into())?;
    let nex = SetOptions { set_condition: SetCondition::OnlyIfEqualOrDoesNotExist, ..Default::default() };
    let r = ss.set(key.clone(), b"other".to_vec(), REQ, None, nex).await.map_err(e("SET NEX"))?;
    ensure(!r.response, || "SET NEX of a different value: applied, want not applied".into())?;

    let r = ss.del(key.clone(), None, REQ).await.map_err(e("DEL"))?;
    ensure(r.response == 1, || format!("DEL: {} deleted, want 1", r.response))?;
    let r = ss.get(key.clone(), REQ).await.map_err(e("GET deleted"))?;
    ensure(r.response.is_none(), || format!("GET after DEL: {:?}, want not found", r.response))?;
    let r = ss.del(key.clone(), None, REQ).await.map_err(e("DEL missing"))?;
    ensure(r.response == 0, || format!("DEL of a missing key: {}, want 0", r.response))?;

    ss.set(key.clone(), b"mine".to_vec(), REQ, None, uncond).await.map_err(e("SET for VDEL"))?;
    let r = ss.vdel(key.clone(), b"theirs".to_vec(), None, REQ).await.map_err(e("VDEL mismatch"))?;
    ensure(r.response == -1, || format!("VDEL of another value: {}, want -1", r.response))?;
    let r = ss.vdel(key.clone(), b"mine".to_vec(), None, REQ).await.map_err(e("VDEL"))?;
    ensure(r.response == 1, || format!("VDEL of the stored value: {}, want 1", r.response))?;
    let r = ss.vdel(key.clone(), b"mine".to_vec(), None, REQ).await.map_err(e("VDEL missing"))?;
    ensure(r.response == 0, || format!("VDEL of a missing key: {}, want 0", r.response))?;
    let r = ss.get(key, REQ).await.map_err(e("GET after VDEL"))?;
    ensure(r.response.is_none(), || format!("GET after VDEL: {:?}, want not found", r.response))?;
    println!("ok  set, get, delete, vdelete");
    Ok(())
}

/// A observes a key; B's SET and DEL of it reach A as notifications.
async fn notifications(a: &Conn, b: &Conn) -> Res<()> {
    let key = format!("{}/watched", a.id).into_bytes();
    let e = |what: &'static str| move |err: state_store::Error| format!("{what}: {err}");
    let mut obs = a.ss.observe(key.clone(), REQ).await.map_err(e("observe (KEYNOTIFY)"))?.response;

    let r = b.ss.set(key.clone(), b"hello".to_vec(), REQ, None, SetOptions::default()).await.map_err(e("B SET"))?;
    let sv = version("B SET", r.version)?;
    let n = next(&mut obs, "notification of B's SET").await?;
    ensure(n.key == key && is_set(&n, b"hello") && n.version == sv, || {
        format!(
            "notification of B's SET: got {}, want SET(hello) of {} at {sv}",
            show(&n),
            String::from_utf8_lossy(&key)
        )
    })?;

    let r = b.ss.del(key.clone(), None, REQ).await.map_err(e("B DEL"))?;
    ensure(r.response == 1, || format!("B DEL: {}, want 1", r.response))?;
    let n = next(&mut obs, "notification of B's DEL").await?;
    ensure(n.key == key && n.operation == Operation::Del && newer(&n.version, &sv), || {
        format!("notification of B's DEL: got {}, want DELETE newer than {sv}", show(&n))
    })?;

    let r = a.ss.unobserve(key, REQ).await.map_err(e("unobserve (KEYNOTIFY STOP)"))?;
    ensure(r.response, || "unobserve: the store says the key was not observed".into())?;
    println!("ok  key notifications: SET and DELETE observed");
    Ok(())
}

/// The leased lock: A acquires it with auto-renewal; B's `lock` waits through
/// several renewals (more than one expiry); A releases; B gets it; B releases.
/// C observes the lock key and sees every change.
async fn leased_lock(a: &Conn, b: &Conn, c: &Conn) -> Res<()> {
    let name = format!("{}/lock", a.id).into_bytes();
    let le =
        |what: &'static str| move |err: azure_iot_operations_services::leased_lock::Error| format!("{what}: {err}");
    let holder = |conn: &Conn| -> Res<lock::Client> {
        lock::Client::new(conn.ss.clone(), name.clone(), conn.id.clone().into_bytes()).map_err(|e| e.to_string())
    };
    let (lock_a, lock_b) = (holder(a)?, holder(b)?);
    let mut obs = c.ss.observe(name.clone(), REQ).await.map_err(|e| format!("C observe: {e}"))?.response;

    let t1 = lock_a.lock(LOCK_TTL, REQ, Some(RENEW)).await.map_err(le("A lock"))?;
    let acquired = Instant::now();
    let n = next(&mut obs, "C: A's acquire").await?;
    ensure(is_set(&n, a.id.as_bytes()) && n.version == t1, || {
        format!("C: A's acquire: got {}, want SET({}) at {t1}", show(&n), a.id)
    })?;

    let waiter = {
        let lock_b = lock_b.clone();
        tokio::spawn(async move { lock_b.lock(LOCK_TTL, REQ, None).await })
    };

    // Renewals: SETs of A's name with newer versions, past the first expiry.
    let mut last = t1.clone();
    for i in 1..=RENEWALS {
        let n = next(&mut obs, "C: A's renewal").await?;
        ensure(is_set(&n, a.id.as_bytes()) && newer(&n.version, &last), || {
            format!("C: renewal {i}: got {}, want SET({}) newer than {last}", show(&n), a.id)
        })?;
        last = n.version;
    }
    let held = acquired.elapsed();
    ensure(held > LOCK_TTL, || format!("{RENEWALS} renewals took {held:?}, not past one expiry ({LOCK_TTL:?})"))?;
    ensure(!waiter.is_finished(), || format!("B's lock returned while A held the lock ({held:?} after A's acquire)"))?;
    let h = c.ss.get(name.clone(), REQ).await.map_err(|e| format!("GET lock: {e}"))?;
    ensure(h.response.as_deref() == Some(a.id.as_bytes()), || {
        format!("holder after renewals: {:?}, want {}", h.response, a.id)
    })?;

    // The SDK's unlock stops auto-renewal only when the renewal task is idle
    // between renewals: a renewal in flight at that moment goes on renewing.
    // The task stores its new token and goes back to waiting in one poll, so
    // on this single-threaded runtime, once A's token has caught up with the
    // last renewal C saw, the task is idle (a yield lets A's session run).
    let deadline = Instant::now() + WAIT;
    while !lock_a.current_lock_fencing_token().is_some_and(|t| t == last || newer(&t, &last)) {
        ensure(Instant::now() < deadline, || "A never saw its own last renewal".into())?;
        tokio::task::yield_now().await;
    }
    lock_a.unlock(REQ).await.map_err(le("A unlock"))?;

    // A renewal may have landed between C's last one and the unlock.
    let n = loop {
        let n = next(&mut obs, "C: A's release").await?;
        if !(is_set(&n, a.id.as_bytes()) && newer(&n.version, &last)) {
            break n;
        }
        last = n.version;
    };
    ensure(n.operation == Operation::Del, || format!("C: A's release: got {}, want DELETE", show(&n)))?;
    let n = next(&mut obs, "C: B's acquire").await?;
    ensure(is_set(&n, b.id.as_bytes()), || format!("C: after A's release: got {}, want SET({})", show(&n), b.id))?;
    let tb = match tokio::time::timeout(WAIT, waiter).await {
        Ok(Ok(Ok(t))) => t,
        Ok(Ok(Err(e))) => return Err(format!("B lock: {e}")),
        Ok(Err(e)) => return Err(format!("B lock task: {e}")),
        Err(_) => return Err(format!("B lock: not acquired within {WAIT:?} of A's release")),
    };
    ensure(tb == n.version && newer(&tb, &last), || {
        format!("B's token {tb}: want the SET's {} and newer than A's {last}", n.version)
    })?;

    lock_b.unlock(REQ).await.map_err(le("B unlock"))?;
    let n = next(&mut obs, "C: B's release").await?;
    ensure(n.operation == Operation::Del, || format!("C: B's release: got {}, want DELETE", show(&n)))?;
    let h = c.ss.get(name, REQ).await.map_err(|e| format!("GET lock: {e}"))?;
    ensure(h.response.is_none(), || format!("lock key after both released: {:?}, want none", h.response))?;
    println!("ok  leased lock: A acquired, renewed {RENEWALS} times over {held:?} (expiry {LOCK_TTL:?}) while B waited; A released; B acquired and released");
    Ok(())
}

async fn check() -> Res<()> {
    let (a, b, c) = (connect("a").await?, connect("b").await?, connect("c").await?);
    println!("ok  connected {}, {}, {}", a.id, b.id, c.id);
    crud(&a).await?;
    notifications(&a, &b).await?;
    leased_lock(&a, &b, &c).await?;
    for conn in [a, b, c] {
        conn.ss.shutdown().await.map_err(|e| format!("{}: shutdown: {e}", conn.id))?;
        conn.exit.try_exit().map_err(|e| format!("{}: exit: {e}", conn.id))?;
        tokio::time::timeout(WAIT, conn.run)
            .await
            .map_err(|_| format!("{}: session did not end", conn.id))?
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let started = Instant::now();
    match tokio::time::timeout(Duration::from_secs(120), check()).await {
        Ok(Ok(())) => println!("PASS: Rust SDK against the state store in {:?}", started.elapsed()),
        Ok(Err(msg)) => {
            eprintln!("FAIL: {msg}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("FAIL: the check did not finish within 120 s");
            std::process::exit(1);
        }
    }
}
