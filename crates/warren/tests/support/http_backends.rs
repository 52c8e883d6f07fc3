//! Backends for the HTTP tests: a real WebSocket echo server and an h2c server that answers
//! with trailers (shared by the in-process and the end-to-end tests).
#![allow(dead_code)]

use std::net::SocketAddr;

use axum::body::Bytes;
use tokio::net::TcpListener;

/// A WebSocket echo backend (a real WebSocket server).
pub async fn websocket_echo() -> SocketAddr {
    use futures_util::{SinkExt, StreamExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                    return;
                };
                while let Some(Ok(message)) = ws.next().await {
                    if message.is_binary() || message.is_text() {
                        if ws.send(message).await.is_err() {
                            return;
                        }
                    } else if message.is_close() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// An h2c backend (gRPC-like): answers with a body and trailers.
pub async fn h2c_backend() -> SocketAddr {
    use http_body_util::StreamBody;
    use hyper::body::Frame;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |request: http::Request<hyper::body::Incoming>| async move {
                        let version = format!("{:?} {}", request.version(), request.uri().path());
                        let mut trailers = http::HeaderMap::new();
                        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                        let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = vec![
                            Ok(Frame::data(Bytes::from(version))),
                            Ok(Frame::trailers(trailers)),
                        ];
                        Ok::<_, std::convert::Infallible>(http::Response::new(StreamBody::new(
                            futures_util::stream::iter(frames),
                        )))
                    },
                );
                let _ =
                    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
            });
        }
    });
    addr
}
