//! `cohort localnet`: the embedded chain served as Solana JSON-RPC over
//! HTTP on 127.0.0.1, so several processes (nodes, a requester, the stock
//! `solana` tooling) share one chain. HTTP/1.1 with keep-alive, one request
//! per message (the RPC client never batches); errors are JSON-RPC errors
//! with status 200, as the client expects.

use super::embedded::Embedded;
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::net::SocketAddr;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Requests above this are refused: the largest real one (a transaction)
/// is under 2 kB.
const MAX_BODY: usize = 1 << 20;

/// A running server; dropping it (or [`Server::stop`]) stops serving while
/// the chain itself lives on in its [`Embedded`].
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(chain: Embedded, addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let chain = chain.clone();
                conns.spawn(async move {
                    let _ = serve(chain, stream).await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and drops every open connection.
    pub fn stop(self) {
        self.task.abort();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(chain: Embedded, stream: TcpStream) -> Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut len = None;
        let mut close = false;
        let mut line = String::new();
        if r.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let post = line.starts_with("POST ");
        loop {
            line.clear();
            if r.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let lower = l.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse::<usize>().ok();
            } else if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let (status, body) = match len {
            _ if !post => (
                "405 Method Not Allowed",
                error(Value::Null, -32600, "use POST"),
            ),
            Some(n) if n <= MAX_BODY => {
                let mut buf = vec![0u8; n];
                r.read_exact(&mut buf).await?;
                ("200 OK", answer(&chain, &buf).await)
            }
            _ => {
                close = true;
                (
                    "413 Payload Too Large",
                    error(Value::Null, -32600, "request too large"),
                )
            }
        };
        let body = body.to_string();
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{}\r\n",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        );
        w.write_all(head.as_bytes()).await?;
        w.write_all(body.as_bytes()).await?;
        w.flush().await?;
        if close {
            return Ok(());
        }
    }
}

fn error(id: Value, code: i64, message: &str) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": { "code": code, "message": message } })
}

async fn answer(chain: &Embedded, body: &[u8]) -> Value {
    let Ok(req) = serde_json::from_slice::<Value>(body) else {
        return error(Value::Null, -32700, "Parse error");
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = req.get("method").and_then(Value::as_str) else {
        return error(id, -32600, "Invalid request: no method");
    };
    let params = req.get("params").cloned().unwrap_or(Value::Null);
    match chain.dispatch(method, params).await {
        Ok(result) => json!({ "jsonrpc": "2.0", "id": id, "result": result }),
        Err(f) => {
            let mut e = json!({ "code": f.code, "message": f.message });
            if let Some(d) = f.data {
                e["data"] = d;
            }
            json!({ "jsonrpc": "2.0", "id": id, "error": e })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chain::{Chain, LAMPORTS_PER_SOL};
    use cohort_program::state::Job;
    use solana_rpc_client::nonblocking::rpc_client::RpcClient;
    use solana_sdk::signature::{Keypair, Signer};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_stock_client_works_over_http_and_the_chain_outlives_a_server_restart() {
        let chain = Embedded::start().await.unwrap();
        let server = Server::start(chain.clone(), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let addr = server.addr;
        let url = server.url();
        let c = Chain::connect(&url, &cohort_program::ID).await.unwrap();
        let who = Keypair::new();
        c.airdrop(&who.pubkey(), 2 * LAMPORTS_PER_SOL)
            .await
            .unwrap();
        let spec = crate::job::SpecFile::default().to_spec([3; 32]).unwrap();
        let job = crate::job::create(&c, &who, 1, spec).await.unwrap();
        let listed = c.all::<Job>().await.unwrap();
        assert_eq!(
            listed.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            vec![job]
        );
        // The history an explorer reads: newest first, pages by `before`,
        // nothing for an address no transaction named.
        let sigs = c
            .rpc
            .get_signatures_for_address(&who.pubkey())
            .await
            .unwrap();
        assert!(sigs.len() >= 2, "airdrop and job creation: {sigs:?}");
        let older = c
            .rpc
            .get_signatures_for_address_with_config(
                &who.pubkey(),
                solana_rpc_client::rpc_client::GetConfirmedSignaturesForAddress2Config {
                    before: Some(sigs[0].signature.parse().unwrap()),
                    limit: Some(1),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(older.len(), 1);
        assert_eq!(older[0].signature, sigs[1].signature);
        let stranger = Keypair::new().pubkey();
        assert!(
            c.rpc
                .get_signatures_for_address(&stranger)
                .await
                .unwrap()
                .is_empty()
        );

        // The server goes away: a clear transport error, not a hang.
        server.stop();
        let plain = RpcClient::new(url.clone());
        let e = plain
            .get_balance(&who.pubkey())
            .await
            .unwrap_err()
            .to_string();
        assert!(!e.is_empty());
        let e = Chain::connect(&url, &cohort_program::ID)
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cannot reach the chain"), "{e}");

        // Back on the same port, with the same chain behind it.
        let _server = Server::start(chain, addr).await.unwrap();
        let c = Chain::connect(&url, &cohort_program::ID).await.unwrap();
        assert!(c.balance(&who.pubkey()).await.unwrap() > LAMPORTS_PER_SOL);
        assert_eq!(c.all::<Job>().await.unwrap().len(), 1);
        // A transaction refused by the program is a named error, with no state change.
        let e = crate::job::create(
            &c,
            &who,
            1,
            crate::job::SpecFile::default().to_spec([3; 32]).unwrap(),
        )
        .await
        .unwrap_err()
        .to_string();
        assert!(e.contains("already used"), "{e}");
        // A refused transaction lands nowhere, so it is not in the history.
        assert_eq!(
            c.rpc
                .get_signatures_for_address(&who.pubkey())
                .await
                .unwrap()
                .len(),
            sigs.len()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn malformed_requests_get_json_rpc_errors() {
        use tokio::io::AsyncReadExt;
        let chain = Embedded::start().await.unwrap();
        let server = Server::start(chain, "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        for (body, code) in [
            ("not json", -32700),
            ("{\"jsonrpc\":\"2.0\",\"id\":1}", -32600),
            (
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"noSuchMethod\"}",
                -32601,
            ),
            (
                "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"getBalance\",\"params\":[\"xyz\"]}",
                -32602,
            ),
        ] {
            let mut s = TcpStream::connect(server.addr).await.unwrap();
            let req = format!(
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(req.as_bytes()).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
            let json: Value = serde_json::from_str(out.split("\r\n\r\n").nth(1).unwrap()).unwrap();
            assert_eq!(json["error"]["code"], code, "{body}: {json}");
        }
    }
}
