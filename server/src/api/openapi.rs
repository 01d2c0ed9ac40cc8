//! The OpenAPI document for the key API, served at `/api/openapi.json`.

use utoipa::{
    openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme},
    Modify, OpenApi,
};

use super::{alerts, cap_increases, keys, ApiErrorBody, ApiErrorDetail};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Vaultcap key API",
        description = "Vault keys for billing jobs, their cap increase requests and their alerts. Authenticate with an API token \
                       holding the route's scope (`vaultcap token add --scope …`) as `Authorization: Bearer …`."
    ),
    paths(keys::create, keys::list, keys::show, keys::revoke, keys::show_request, cap_increases::create,
        cap_increases::list, alerts::list, alerts::acknowledge),
    components(schemas(keys::CreateKey, keys::KeyView, keys::CreatedKey, keys::RequestedKey,
        keys::KeyRequestView, keys::Revoke,
        alerts::AlertView, alerts::Deliveries, alerts::Acknowledge, cap_increases::CreateRequest,
        cap_increases::RequestView, ApiErrorBody, ApiErrorDetail)),
    modifiers(&ApiTokenAuth)
)]
struct ApiDoc;

struct ApiTokenAuth;

impl Modify for ApiTokenAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_token",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}
