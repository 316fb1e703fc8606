//! The stats API: `GET /v1/sessions` answers the registry's
//! [`longhaul_stats_api::Snapshot`] as JSON (`?view=series`: its series
//! view, what the exporter exports; `?view=rows`: the same with each stream
//! as an array, what the exporter asks for; another view is 400), 404 for other
//! paths, 405 for other methods. Served by `longhaul-http-serve`, whose limits (bounded
//! request head, total deadlines, pending connections pushed out when
//! full) keep a slow or hostile local client from growing the engine or
//! locking the exporter out.

use std::net::TcpListener;
use std::sync::Arc;

use longhaul_http_serve::{Limits, Response, Server};

use crate::registry::Registry;

/// Snapshots built at once. A snapshot takes a few locks and serialises
/// ~300 KB for 1,000 streams; the only regular client is one exporter.
const MAX_IN_FLIGHT: usize = 4;

/// Serves the API on `listener` from a background thread.
pub fn spawn(listener: TcpListener, registry: Arc<Registry>) -> std::io::Result<Server> {
    let limits = Limits {
        max_in_flight: MAX_IN_FLIGHT,
        ..Limits::default()
    };
    Server::spawn(
        listener,
        "stats-api",
        limits,
        Arc::new(move |req| answer(req, &registry)),
    )
}

fn answer(req: &longhaul_http_serve::Request, registry: &Registry) -> Response {
    if req.path() != longhaul_stats_api::SESSIONS_PATH {
        return Response::text(404, "not found\n");
    }
    if req.method() != "GET" && req.method() != "HEAD" {
        return Response::text(405, "only GET\n");
    }
    let snapshot = registry.snapshot();
    let view = req
        .query()
        .unwrap_or("")
        .split('&')
        .find_map(|pair| pair.strip_prefix("view="));
    let query = req.query();
    let snapshot = match view {
        None => snapshot,
        Some(_) if query == Some(longhaul_stats_api::SERIES_VIEW_QUERY) => snapshot.series_view(),
        Some(_) if query == Some(longhaul_stats_api::ROWS_VIEW_QUERY) => snapshot.rows_view(),
        Some(other) => {
            return Response::text(
                400,
                &format!("unknown view {other:?}; the views there are: view=series, view=rows\n"),
            )
        }
    };
    let body = serde_json::to_vec(&snapshot).unwrap_or_default();
    Response::new(200, "application/json", body)
}
