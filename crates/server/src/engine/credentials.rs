//! Credentials: tokens granted, revoked and rotated; who may register a node.

use super::*;

impl<S: Store> Engine<S> {
    /// A fresh token for `principal`, stored hashed in this batch. It goes
    /// into the map at once, so that a revocation later in the same batch
    /// finds it; no one can use it before the batch commits, since no one
    /// has it until the reply (and if the commit fails, the server exits).
    pub(super) fn grant(&mut self, principal: Principal) -> Result<String, Fail> {
        let token = new_token();
        let hash = hash_token(&token);
        let row = TokenRow {
            hash: hash.clone(),
            tenant: principal.tenant.as_ref().map(|(id, _)| *id),
            scope: principal.scope,
            node: principal.node.clone(),
        };
        self.store.put_token(&row)?;
        if let (Scope::Node, Some(node)) = (principal.scope, &principal.node) {
            self.access.node_credentials.insert(node.clone(), hash.clone());
        }
        self.access.tokens.write().expect("token map").insert(hash, TokenState::Valid(principal));
        Ok(token)
    }

    /// Revokes every token `which` picks, at once: the next request
    /// carrying one is refused with `why`, even before this batch commits
    /// (if the commit fails, the server exits). Returns how many.
    pub(super) fn revoke(&mut self, which: impl Fn(&Principal) -> bool, why: &str) -> Result<u32, Fail> {
        let hashes: Vec<String> = self
            .access
            .tokens
            .read()
            .expect("token map")
            .iter()
            .filter(|(_, state)| matches!(state, TokenState::Valid(p) if which(p)))
            .map(|(hash, _)| hash.clone())
            .collect();
        for hash in &hashes {
            self.store.delete_token(hash)?;
        }
        let mut map = self.access.tokens.write().expect("token map");
        for hash in &hashes {
            map.insert(hash.clone(), TokenState::Revoked(why.to_string()));
        }
        self.access.node_credentials.retain(|_, hash| !hashes.contains(hash));
        Ok(hashes.len() as u32)
    }

    /// `ebb tenant token rotate|revoke NAME`: the tenant's tokens are all
    /// revoked, and with `issue` one new token is made. The admin token,
    /// though it acts for the default tenant, is not a tenant token.
    pub(super) fn tenant_tokens(&mut self, name: &str, issue: bool) -> Result<ebb_api::TenantTokens, Fail> {
        let id = self
            .tenants
            .names
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| Refusal::not_found(format!("tenant {name}: not found")))?;
        let why = format!(
            "this token of tenant {name} was {} by the operator",
            if issue { "replaced (rotated)" } else { "revoked" }
        );
        let revoked = self
            .revoke(|p| p.scope == Scope::Tenant && p.tenant.as_ref().is_some_and(|(t, _)| *t == id), &why)?;
        let token = if issue { Some(self.grant(Principal::tenant(Scope::Tenant, id, name))?) } else { None };
        tracing::info!(tenant = name, revoked, issued = issue, "tenant tokens changed by the operator");
        Ok(ebb_api::TenantTokens { tenant: name.to_string(), token, revoked })
    }

    /// A new join token, written to `join.token` (0600) before it is
    /// stored; the old one is refused from now. Nodes keep their own
    /// credentials.
    pub(super) fn rotate_join_token(&mut self) -> Result<ebb_api::JoinToken, Fail> {
        let path = self.config.data_dir.join("join.token");
        let token = new_token();
        write_secret(&path, &token).map_err(|e| Refusal::internal(format!("{}: {e}", path.display())))?;
        let revoked = self.revoke(
            |p| p.scope == Scope::Agent,
            "this join token was replaced (rotated) by the operator: use the new one in the server's join.token",
        )?;
        let hash = hash_token(&token);
        self.store.put_token(&TokenRow {
            hash: hash.clone(),
            tenant: None,
            scope: Scope::Agent,
            node: None,
        })?;
        self.access.tokens.write().expect("token map").insert(hash, TokenState::Valid(Principal::join()));
        tracing::info!(path = %path.display(), revoked, "join token rotated by the operator");
        Ok(ebb_api::JoinToken { token, path: path.display().to_string(), revoked })
    }

    /// Whether `principal` may register node `node`: its own credential,
    /// or the join token for a node that has none. Returns whether the
    /// node is to be issued a credential (once the rest of the
    /// registration has passed).
    pub(super) fn may_register(&self, principal: &Principal, node: &str) -> Result<bool, Refusal> {
        match principal.scope {
            Scope::Node if principal.node.as_deref() == Some(node) => {
                self.credential_valid(node)?;
                Ok(false)
            }
            Scope::Node => Err(Refusal::forbidden(&format!(
                "this credential is node {}'s; it cannot register node {node}",
                principal.node.as_deref().unwrap_or("?")
            ))),
            Scope::Agent if self.access.node_credentials.contains_key(node) => Err(Refusal::forbidden(&format!(
                "node {node}: already has its own credential, so the join token cannot register it; the agent \
                 registers with its node.credential, or the operator runs `ebb nodes remove {node}` first"
            ))),
            Scope::Agent => Ok(true),
            _ => Err(Refusal::forbidden("registering needs the join token or the node's credential")),
        }
    }

    /// The node's credential has not been revoked since the request was
    /// authenticated.
    pub(super) fn credential_valid(&self, node: &str) -> Result<(), Refusal> {
        if self.access.node_credentials.contains_key(node) {
            return Ok(());
        }
        Err(Refusal::unauthenticated(&format!(
            "node {node}'s credential was revoked by the operator (ebb nodes remove {node}); to rejoin, delete \
             the agent's node.credential and restart it with the join token"
        )))
    }
}

pub(super) fn write_secret(path: &std::path::Path, secret: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(path)?;
    file.write_all(secret.as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()
}
