//! Plain HTTP/1.1 GETs against a node's metrics listener (`/metrics`, `/health`, `/ready`).

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `ip:port`: (status code, body).
pub async fn http_get(ip: &str, port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = tokio::net::TcpStream::connect((ip, port))
        .await
        .map_err(|e| format!("connect {ip}: {e}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP head in {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((code, body.to_owned()))
}
