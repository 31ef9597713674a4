//! A private `redis-server` for one test: started on a free loopback port, killed on drop.
//!
//! Never skips: without `redis-server` on the PATH the test fails and says how to install it.

#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "apt-get install -y redis-server";

/// A running `redis-server`, killed when dropped.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local address").port()
}

impl RedisServer {
    /// Starts a server with no persistence on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("tollgate-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut s = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.restart();
        s
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the server at once (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the server process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, sig: &str) {
        let pid = self
            .child
            .as_ref()
            .expect("server running")
            .id()
            .to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// Starts the server again on the same port (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        let port = self.port.to_string();
        let child = Command::new("redis-server")
            .args(["--port", &port, "--save", "", "--appendonly", "no"])
            .args(["--bind", "127.0.0.1"])
            .args(&self.extra)
            .current_dir(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server ({e}); these tests need it: {INSTALL}")
            });
        self.child = Some(child);
        self.wait_for_ping();
    }

    fn wait_for_ping(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.cli(&["PING"]).is_some_and(|out| out.trim() == "PONG") {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("redis-server exited with {status} on port {}", self.port);
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Runs `redis-cli` against this server; `None` when it cannot connect.
    pub fn cli(&self, args: &[&str]) -> Option<String> {
        if TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            return None;
        }
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install it: {INSTALL}"));
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The number of calls of `command` (lower case, e.g. `evalsha`) since the start.
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]).unwrap_or_default();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.resume();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A connection of the test's own to `server`, with no response timeout (the redis crate's
/// default of 500 ms is a bound on the machine's speed, which a loaded machine breaks).
pub async fn connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url())
        .expect("a loopback URL")
        .get_multiplexed_async_connection_with_config(
            &redis::AsyncConnectionConfig::new().set_response_timeout(None),
        )
        .await
        .expect("connect to the test's redis-server")
}

/// Real time against a test clock. A test on the manual clock judges Redis keys by that clock,
/// but the server expires them by its own: a key written with a time to live of `d` (the time
/// until it is idle on the manual clock) is gone once `d` of real time passed before the test
/// made it persist, however still the manual clock stood. On a loaded machine that happens, and
/// the key's state is then lost for a reason that is not the crate's.
///
/// [`keep_all`](Self::keep_all) makes every key persist after each step; what the server
/// expired before that is counted by `INFO stats` (`expired_keys`: expiries only, not the
/// scripts' own deletions), and a case in which it expired any is void, not failed
/// ([`judge`](Self::judge)).
pub struct ServerClock {
    conn: redis::aio::MultiplexedConnection,
    expired: u64,
}

impl ServerClock {
    /// Watches the server of `conn` from now.
    pub async fn watch(conn: &redis::aio::MultiplexedConnection) -> Self {
        let mut conn = conn.clone();
        let expired = expired_keys(&mut conn).await;
        ServerClock { conn, expired }
    }

    /// Removes the time to live of every key of the server: nothing expires on the server's
    /// clock from now until a script writes again.
    pub async fn keep_all(&mut self) {
        let _: () = redis::cmd("EVAL")
            .arg("for _, k in ipairs(redis.call('KEYS', '*')) do redis.call('PERSIST', k) end")
            .arg(0)
            .query_async(&mut self.conn)
            .await
            .expect("PERSIST every key");
    }

    /// Whether the server expired a key on its own clock since [`watch`](Self::watch).
    pub async fn expired_any(&mut self) -> bool {
        expired_keys(&mut self.conn).await > self.expired
    }

    /// The verdict of a property case run on the manual clock: `outcome` as it is, unless the
    /// server expired a key on its own clock meanwhile, which voids the case (a rejection:
    /// proptest draws another).
    pub async fn judge<T>(
        mut self,
        outcome: Result<T, proptest::test_runner::TestCaseError>,
    ) -> Result<T, proptest::test_runner::TestCaseError> {
        if self.expired_any().await {
            return Err(proptest::test_runner::TestCaseError::reject(
                "the server expired a key on its own clock while the manual clock stood",
            ));
        }
        outcome
    }
}

/// `expired_keys` of the server's `INFO stats`.
pub async fn expired_keys(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix("expired_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("expired_keys in INFO stats")
}

/// Three cluster masters on loopback, with the slots spread over them.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(RedisServer::addr).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}); install it: {INSTALL}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !nodes.iter().all(|n| {
            n.cli(&["CLUSTER", "INFO"])
                .is_some_and(|i| i.contains("cluster_state:ok"))
        }) {
            assert!(Instant::now() < deadline, "the cluster did not become ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }
}
