//! The console's own routes (forms and exports), each registered with the
//! role it needs. The check runs before the handler, so a handler cannot
//! forget it, and [`ConsoleRoutes::table`] lists every route for the
//! access tests.

use axum::{
    extract::{FromRequestParts, Request, State},
    handler::Handler,
    http::request::Parts,
    http::Method,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::{on, MethodFilter},
    Router,
};
use serde_json::json;

use super::{client_ip::ClientIp, error::HttpError};
use app::{
    actions::sql::{self as actions, Actor},
    domain::{Me, Role},
    error::AppError,
    ssr::AppState,
};

/// One console route and the role it needs (`None`: anyone, e.g. sign-in).
#[derive(Debug, Clone)]
pub struct ConsoleRoute {
    pub method: Method,
    pub path: &'static str,
    pub role: Option<Role>,
}

pub struct ConsoleRoutes {
    state: AppState,
    router: Router<AppState>,
    table: Vec<ConsoleRoute>,
}

impl ConsoleRoutes {
    pub fn new(state: AppState) -> Self {
        Self {
            state,
            router: Router::new(),
            table: Vec::new(),
        }
    }

    /// `handler` answers `method` on `path` for operators whose role
    /// allows `role`; anyone else is refused (and the refusal logged).
    pub fn route<H, T>(mut self, method: Method, path: &'static str, role: Role, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        let guard = middleware::from_fn_with_state((self.state.clone(), role), require_role);
        self.router = self
            .router
            .route(path, on(filter(&method), handler).route_layer(guard));
        self.table.push(ConsoleRoute {
            method,
            path,
            role: Some(role),
        });
        self
    }

    /// A route for people who are not signed in (signing in and out).
    pub fn open<H, T>(mut self, method: Method, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, AppState>,
        T: 'static,
    {
        self.router = self.router.route(path, on(filter(&method), handler));
        self.table.push(ConsoleRoute {
            method,
            path,
            role: None,
        });
        self
    }

    pub fn table(&self) -> &[ConsoleRoute] {
        &self.table
    }

    pub fn into_router(self) -> Router<AppState> {
        self.router
    }
}

fn filter(method: &Method) -> MethodFilter {
    MethodFilter::try_from(method.clone()).expect("the console uses standard methods only")
}

/// The signed-in operator a guarded route was let through for, and the
/// actor the action log names for what they do (who, from where).
pub struct Operator {
    pub me: Me,
    pub actor: Actor,
    /// The client's address (see [`ClientIp`]).
    pub ip: Option<std::net::IpAddr>,
}

impl<S: Send + Sync> FromRequestParts<S> for Operator {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let me = parts
            .extensions
            .get::<Me>()
            .cloned()
            .ok_or_else(|| HttpError::from(AppError::Unauthenticated))?;
        let Ok(ClientIp(ip)) = ClientIp::from_request_parts(parts, state).await;
        Ok(Self {
            actor: Actor::Operator { id: me.id, ip },
            me,
            ip,
        })
    }
}

/// Lets the request through when the signed-in operator's role allows
/// `role`; otherwise 401, or 403 with the refusal in the action log.
async fn require_role(
    State((state, role)): State<(AppState, Role)>,
    ClientIp(ip): ClientIp,
    request: Request,
    next: Next,
) -> Response {
    let Some(me) = request.extensions().get::<Me>().cloned() else {
        return HttpError::from(AppError::Unauthenticated).into_response();
    };
    if me.role.allows(role) {
        return next.run(request).await;
    }
    let logged = actions::record(
        &state.pool,
        Actor::Operator { id: me.id, ip },
        "refused_console_action",
        "route",
        Some(request.uri().path().to_owned()),
        json!({
            "method": request.method().as_str(),
            "needed_role": role.as_str(),
            "role": me.role.as_str(),
        }),
    )
    .await;
    match logged {
        Ok(()) => HttpError::from(AppError::Forbidden(role)).into_response(),
        Err(err) => HttpError::from(err).into_response(),
    }
}
