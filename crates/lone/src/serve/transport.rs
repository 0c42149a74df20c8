//! The HTTP transport: lone's own accept loop over hyper's HTTP/1 connections, so that no
//! client can hold the server with a slow or stuck connection.
//!
//! - **Header timeout** (`--header-timeout`, default 15 s): a request's headers must arrive
//!   within it, and hyper starts the same timer while a kept-alive connection waits for its
//!   next request, so it is the idle keep-alive timeout too (nginx: `client_header_timeout`,
//!   `keepalive_timeout`).
//! - **Body timeout** (`--timeout`, llama-server's read timeout; default 60 s): the whole
//!   body must arrive within it, else 408 in OpenAI's error JSON ([`read_body`]).
//! - **Body size**: a `Content-Length` over the limit is refused with 413 before any of the
//!   body is read; a chunked body that grows past it gets the same answer.
//! - **Connections** (`--max-connections`, default 512): past the limit a new connection
//!   gets one 503 (OpenAI JSON, `Retry-After: 1`) and is closed.
//! - **Shutdown**: on SIGTERM/SIGINT the listener closes, connections get 2 s to finish
//!   (streams are ended by the engine's shutdown), then the rest are dropped.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use http_body_util::BodyExt;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::openai::ApiError;

/// How long open connections get to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(2);

/// The transport's limits (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub body_limit: usize,
    pub max_connections: usize,
}

/// Serve `app` on `listener` until `shutdown` resolves, then drain for at most [`DRAIN`].
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((s, _)) => s,
                // Out of file descriptors and the like: let the others finish first.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream));
            continue;
        };
        let svc = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(stream), svc));
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(DRAIN, graceful.shutdown()).await;
}

/// One 503 for a connection over the limit, then close it.
async fn refuse(mut stream: TcpStream) {
    let body = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        "too many open connections (--max-connections); retry later",
    )
    .code("too_many_connections")
    .body()
    .to_string();
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let write = async {
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), write).await;
}

/// Middleware: the request body, whole, within the body timeout and size limit, before any
/// handler runs (handlers then read it from memory).
pub async fn read_body(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.body_limit as u64) {
        return too_large(limits.body_limit);
    }
    let (parts, body) = req.into_parts();
    let limited = http_body_util::Limited::new(body, limits.body_limit);
    let bytes: Bytes = match tokio::time::timeout(limits.body_timeout, limited.collect()).await {
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                format!(
                    "the request body did not arrive within {} s (--timeout)",
                    limits.body_timeout.as_secs_f64()
                ),
            )
            .code("request_timeout")
            .into_response()
        }
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return too_large(limits.body_limit)
        }
        Ok(Err(e)) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("cannot read the request body: {e}"),
            )
            .into_response()
        }
        Ok(Ok(c)) => c.to_bytes(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

fn too_large(limit: usize) -> Response {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("the request body is larger than {limit} bytes"),
    )
    .code("request_too_large")
    .into_response()
}
