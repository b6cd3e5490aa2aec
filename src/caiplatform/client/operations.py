"""The client's name for every operation of the API: `(METHOD, path) -> (resource, method[, verb])`.

The resources in `caiplatform/client/_async/resources/` are generated from this table and the served
`/openapi.json` (`python -m caiplatform.client.generate`); a test checks that every operation of the
document has a name here, so every route is reachable through the client. A `verb` is the method suffix
that the route's last path segment carries (`.../topics/{topic}:publish`).
"""

from __future__ import annotations

from typing import NamedTuple


class Name(NamedTuple):
    resource: str
    method: str
    verb: str | None = None


P = "/v1/projects/{projectID}"
Q = "/v1/projects/{project_id}"
A = "/v1/agents/{name}"

OPERATIONS: dict[tuple[str, str], list[Name]] = {
    # -- health
    ("GET", "/healthz"): [Name("health", "check")],
    ("GET", "/livez"): [Name("health", "live")],
    # -- auth, users, keys, orgs, invitations, search, profile, admin
    ("POST", "/v1/auth/login"): [Name("auth", "login")],
    ("GET", "/v1/auth/me"): [Name("auth", "me")],
    ("POST", "/v1/auth/change-password"): [Name("auth", "change_password")],
    ("GET", "/v1/users"): [Name("users", "list")],
    ("POST", "/v1/users"): [Name("users", "create")],
    ("PATCH", "/v1/users/{email}"): [Name("users", "update")],
    ("DELETE", "/v1/users/{email}"): [Name("users", "delete")],
    ("POST", "/v1/users/{email}/reset-password"): [Name("users", "reset_password")],
    ("GET", "/v1/users/me/keys"): [Name("keys", "list")],
    ("POST", "/v1/users/me/keys"): [Name("keys", "create")],
    ("DELETE", "/v1/users/me/keys/{keyID}"): [Name("keys", "revoke")],
    ("GET", "/v1/orgs"): [Name("orgs", "list")],
    ("POST", "/v1/orgs"): [Name("orgs", "create")],
    ("DELETE", "/v1/orgs/{orgID}"): [Name("orgs", "delete")],
    ("GET", "/v1/orgs/{orgID}/members"): [Name("orgs", "members")],
    ("POST", "/v1/orgs/{orgID}/members"): [Name("orgs", "add_member")],
    ("PATCH", "/v1/orgs/{orgID}/members/{userID}"): [Name("orgs", "update_member")],
    ("DELETE", "/v1/orgs/{orgID}/members/{userID}"): [Name("orgs", "remove_member")],
    ("GET", "/v1/invitations/{token}"): [Name("invitations", "preview")],
    ("POST", "/v1/invitations/accept"): [Name("invitations", "accept")],
    ("GET", "/v1/search"): [Name("search", "query")],
    ("GET", "/v1/profile"): [Name("profile", "get")],
    ("PUT", "/v1/profile/model-key"): [Name("profile", "set_model_key")],
    ("DELETE", "/v1/profile/model-key"): [Name("profile", "delete_model_key")],
    ("POST", "/v1/admin/valkey-acl/backfill"): [Name("admin", "backfill_valkey_acl")],
    # -- projects, members, invitations, service accounts, quota, audit
    ("GET", "/v1/projects"): [Name("projects", "list")],
    ("POST", "/v1/projects"): [Name("projects", "create")],
    ("GET", P): [Name("projects", "get")],
    ("PATCH", P): [Name("projects", "update")],
    ("DELETE", P): [Name("projects", "delete")],
    ("GET", P + "/platform-cloud"): [Name("projects", "cloud")],
    ("PUT", P + "/platform-cloud"): [Name("projects", "set_cloud")],
    ("DELETE", P + "/platform-cloud"): [Name("projects", "delete_cloud")],
    ("GET", P + "/members"): [Name("members", "list")],
    ("POST", P + "/members"): [Name("members", "add")],
    ("PATCH", P + "/members/{userID}"): [Name("members", "update")],
    ("DELETE", P + "/members/{userID}"): [Name("members", "remove")],
    ("PATCH", P + "/members/service-accounts/{saID}"): [Name("members", "update_service_account")],
    ("DELETE", P + "/members/service-accounts/{saID}"): [Name("members", "remove_service_account")],
    ("POST", P + "/break-glass"): [Name("members", "break_glass")],
    ("GET", P + "/invitations"): [Name("invitations", "list")],
    ("POST", P + "/invitations"): [Name("invitations", "create")],
    ("DELETE", P + "/invitations/{invitationID}"): [Name("invitations", "revoke")],
    ("GET", P + "/service-accounts"): [Name("service_accounts", "list")],
    ("POST", P + "/service-accounts"): [Name("service_accounts", "create")],
    ("DELETE", P + "/service-accounts/{sa}"): [Name("service_accounts", "delete")],
    ("GET", P + "/service-accounts/{sa}/keys"): [Name("service_accounts", "keys")],
    ("POST", P + "/service-accounts/{sa}/keys"): [Name("service_accounts", "create_key")],
    ("DELETE", P + "/service-accounts/{sa}/keys/{keyID}"): [Name("service_accounts", "revoke_key")],
    ("GET", P + "/quota"): [Name("projects", "quota")],
    ("GET", P + "/audit"): [Name("projects", "audit")],
    # -- forget a user everywhere, with a receipt
    ("POST", P + "/forget"): [Name("erasures", "forget")],
    ("POST", "/v1/forget"): [Name("erasures", "forget_everywhere")],
    ("GET", P + "/erasures/{erasureID}"): [Name("erasures", "get")],
    # -- agents
    ("GET", "/v1/agents"): [Name("agents", "list")],
    ("POST", "/v1/agents"): [Name("agents", "deploy")],
    ("GET", A): [Name("agents", "get")],
    ("DELETE", A): [Name("agents", "delete")],
    ("POST", A + "/redeploy"): [Name("agents", "redeploy")],
    ("GET", A + "/logs"): [Name("agents", "logs")],
    ("GET", A + "/logs/history"): [Name("agents", "log_history")],
    ("GET", A + "/logs/build"): [Name("agents", "build_log")],
    ("GET", A + "/secrets"): [Name("agents", "secret_keys")],
    ("PUT", A + "/secrets"): [Name("agents", "replace_secrets")],
    ("PATCH", A + "/secrets"): [Name("agents", "update_secrets")],
    ("GET", A + "/env"): [Name("agents", "env")],
    ("PATCH", A + "/env"): [Name("agents", "update_env")],
    ("GET", A + "/files"): [Name("agents", "files")],
    ("GET", A + "/files/{path}"): [Name("agents", "read_file")],
    ("PUT", A + "/files/{path}"): [Name("agents", "write_file")],
    ("DELETE", A + "/files/{path}"): [Name("agents", "delete_file")],
    ("GET", A + "/revisions"): [Name("agents", "revisions")],
    ("POST", A + "/set-traffic"): [Name("agents", "set_traffic")],
    ("GET", A + "/config"): [Name("agents", "config")],
    ("PATCH", A + "/config"): [Name("agents", "update_config")],
    ("GET", A + "/spec"): [Name("agents", "spec")],
    ("GET", A + "/metrics"): [Name("agents", "metrics")],
    ("GET", A + "/embed"): [Name("agents", "embed")],
    ("PUT", A + "/embed"): [Name("agents", "update_embed")],
    ("DELETE", A + "/embed"): [Name("agents", "delete_embed")],
    ("POST", A + "/embed/rotate-key"): [Name("agents", "rotate_embed_key")],
    ("POST", A + "/invoke"): [Name("agents", "invoke")],
    ("POST", A + "/invoke/stream"): [Name("agents", "invoke_stream")],
    ("GET", A + "/users"): [Name("sessions", "users")],
    ("GET", A + "/sessions"): [Name("sessions", "list")],
    ("GET", A + "/sessions/{session_id}"): [Name("sessions", "get")],
    ("DELETE", A + "/sessions/{session_id}"): [Name("sessions", "delete")],
    ("POST", A + "/sessions/{session_id}/memorize"): [Name("sessions", "memorize")],
    ("GET", "/v1/embed/{key}/config"): [Name("embed", "config")],
    ("POST", "/v1/embed/{key}/invoke"): [Name("embed", "invoke")],
    ("GET", "/v1/embed/widget.js"): [Name("embed", "widget_script")],
    ("GET", "/v1/embed/widget-{version}.js"): [Name("embed", "widget_script_version")],
    # -- code sandbox (a workload's own credential)
    ("POST", Q + "/sandbox/execute"): [Name("sandbox", "execute")],
    ("POST", Q + "/sandbox/tool-calls"): [Name("sandbox", "tool_call")],
    # -- MCP servers
    ("POST", P + "/mcpservers"): [Name("mcp_servers", "create")],
    ("GET", P + "/mcpservers"): [Name("mcp_servers", "list")],
    ("GET", P + "/mcpservers/{name}"): [Name("mcp_servers", "get")],
    ("DELETE", P + "/mcpservers/{name}"): [Name("mcp_servers", "delete")],
    ("GET", P + "/mcpservers/{name}/token"): [Name("mcp_servers", "token")],
    ("GET", P + "/mcpservers/{name}/tools"): [Name("mcp_servers", "tools")],
    ("PUT", P + "/mcpservers/{name}/tools/{tool}"): [Name("mcp_servers", "publish_tool")],
    ("DELETE", P + "/mcpservers/{name}/tools/{tool}"): [Name("mcp_servers", "delete_tool")],
    ("GET", P + "/mcpservers/{name}/versions"): [Name("mcp_servers", "versions")],
    ("POST", P + "/mcpservers/{name}/versions/{version_verb}"): [
        Name("mcp_servers", "rollback", "rollback"), Name("mcp_servers", "yank", "yank"),
        Name("mcp_servers", "unyank", "unyank")],
    # -- project secrets and bindings
    ("GET", Q + "/secrets"): [Name("secrets", "list")],
    ("POST", Q + "/secrets"): [Name("secrets", "set")],
    ("POST", Q + "/secrets:{verb}"): [Name("secrets", "issue_project_token", "issue-token")],
    ("GET", Q + "/secrets/{segment}"): [Name("secrets", "get")],
    ("DELETE", Q + "/secrets/{segment}"): [Name("secrets", "delete")],
    ("POST", Q + "/secrets/{segment}"): [Name("secrets", "reveal", "reveal"),
                                         Name("secrets", "issue_token", "issue-token")],
    ("GET", Q + "/secrets/{name}/versions"): [Name("secrets", "versions")],
    ("GET", Q + "/secret-maps"): [Name("secret_maps", "list")],
    ("GET", Q + "/agents/{agent}/secret-maps"): [Name("secret_maps", "for_agent")],
    ("POST", Q + "/agents/{agent}/secret-maps:{verb}"): [Name("secret_maps", "apply", "apply")],
    ("PUT", Q + "/agents/{agent}/secret-maps/{env_name}"): [Name("secret_maps", "bind")],
    ("DELETE", Q + "/agents/{agent}/secret-maps/{env_name}"): [Name("secret_maps", "unbind")],
    # -- serverless services and triggers
    ("GET", Q + "/services"): [Name("services", "list")],
    ("POST", Q + "/services"): [Name("services", "create")],
    ("GET", Q + "/services/{name}"): [Name("services", "get")],
    ("PATCH", Q + "/services/{name}"): [Name("services", "update")],
    ("DELETE", Q + "/services/{name}"): [Name("services", "delete")],
    ("POST", Q + "/services/{name}"): [Name("services", "set_traffic", "set-traffic")],
    ("GET", Q + "/services/{name}/revisions"): [Name("services", "revisions")],
    ("GET", Q + "/services/{name}/logs"): [Name("services", "logs")],
    ("GET", Q + "/services/{name}/spec"): [Name("services", "spec")],
    ("GET", Q + "/services/{name}/metrics"): [Name("services", "metrics")],
    ("GET", Q + "/triggers"): [Name("triggers", "list")],
    ("POST", Q + "/triggers"): [Name("triggers", "create")],
    ("GET", Q + "/triggers/{name}"): [Name("triggers", "get")],
    ("PATCH", Q + "/triggers/{name}"): [Name("triggers", "update")],
    ("DELETE", Q + "/triggers/{name}"): [Name("triggers", "delete")],
    # -- messaging
    ("GET", Q + "/topics"): [Name("topics", "list")],
    ("POST", Q + "/topics"): [Name("topics", "create")],
    ("GET", Q + "/topics/{topic}"): [Name("topics", "get")],
    ("PATCH", Q + "/topics/{topic}"): [Name("topics", "update")],
    ("DELETE", Q + "/topics/{topic}"): [Name("topics", "delete")],
    ("POST", Q + "/topics/{topic}"): [Name("topics", "publish", "publish")],
    ("GET", Q + "/topics/{topic}/subscriptions"): [Name("subscriptions", "list")],
    ("POST", Q + "/topics/{topic}/subscriptions"): [Name("subscriptions", "create")],
    ("GET", Q + "/topics/{topic}/subscriptions/{subscription}"): [Name("subscriptions", "get")],
    ("PATCH", Q + "/topics/{topic}/subscriptions/{subscription}"): [Name("subscriptions", "update")],
    ("DELETE", Q + "/topics/{topic}/subscriptions/{subscription}"): [Name("subscriptions", "delete")],
    ("POST", Q + "/topics/{topic}/subscriptions/{subscription}"): [
        Name("subscriptions", "pull", "pull"), Name("subscriptions", "acknowledge", "acknowledge")],
    ("GET", Q + "/pubsub/quota"): [Name("topics", "quota")],
    ("GET", Q + "/pubsub/usage"): [Name("topics", "usage")],
    ("GET", Q + "/pubsub/credentials"): [Name("topics", "credentials")],
    # -- memory stores
    ("GET", Q + "/memorystores"): [Name("memory_stores", "list")],
    ("POST", Q + "/memorystores"): [Name("memory_stores", "create")],
    ("GET", Q + "/memorystores/{name}"): [Name("memory_stores", "get")],
    ("DELETE", Q + "/memorystores/{name}"): [Name("memory_stores", "delete")],
    ("GET", Q + "/memorystores/{name}/stats"): [Name("memory_stores", "stats")],
    ("POST", Q + "/memorystores/{name}/rotate-credential"): [Name("memory_stores", "rotate_credential")],
    # -- vector indexes
    ("GET", Q + "/indexes"): [Name("indexes", "list")],
    ("POST", Q + "/indexes"): [Name("indexes", "create")],
    ("GET", Q + "/indexes/{name}"): [Name("indexes", "get")],
    ("PATCH", Q + "/indexes/{name}"): [Name("indexes", "update")],
    ("DELETE", Q + "/indexes/{name}"): [Name("indexes", "delete")],
    ("POST", Q + "/indexes/{name}"): [
        Name("indexes", "upsert", "upsert"), Name("indexes", "query", "query"), Name("indexes", "scroll", "scroll"),
        Name("indexes", "delete_points", "delete-points")],
    ("GET", Q + "/vectordb/credentials"): [Name("indexes", "credentials")],
}
