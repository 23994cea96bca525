//! Credentials: tokens granted, revoked and rotated; who may register a node.
//! Each is `Access`'s, with the store's token rows written through `Effects`.

use super::*;

impl Access {
    /// A fresh token for `principal`, stored hashed in this batch. It goes
    /// into the map at once, so that a revocation later in the same batch
    /// finds it; no one can use it before the batch commits, since no one
    /// has it until the reply (and if the commit fails, the server exits).
    pub(super) fn grant(&mut self, fx: &mut impl Effects, principal: Principal) -> Result<String, Fail> {
        let token = new_token();
        let hash = hash_token(&token);
        let row = TokenRow {
            hash: hash.clone(),
            tenant: principal.tenant.as_ref().map(|(id, _)| *id),
            scope: principal.scope,
            node: principal.node.clone(),
        };
        fx.put_token(&row)?;
        if let (Scope::Node, Some(node)) = (principal.scope, &principal.node) {
            self.node_credentials.insert(node.clone(), hash.clone());
        }
        self.tokens.write().expect("token map").insert(hash, TokenState::Valid(principal));
        Ok(token)
    }

    /// Revokes every token `which` picks, at once: the next request
    /// carrying one is refused with `why`, even before this batch commits
    /// (if the commit fails, the server exits). Returns how many.
    pub(super) fn revoke(
        &mut self,
        fx: &mut impl Effects,
        which: impl Fn(&Principal) -> bool,
        why: &str,
    ) -> Result<u32, Fail> {
        let hashes: Vec<String> = self
            .tokens
            .read()
            .expect("token map")
            .iter()
            .filter(|(_, state)| matches!(state, TokenState::Valid(p) if which(p)))
            .map(|(hash, _)| hash.clone())
            .collect();
        for hash in &hashes {
            fx.delete_token(hash)?;
        }
        let mut map = self.tokens.write().expect("token map");
        for hash in &hashes {
            map.insert(hash.clone(), TokenState::Revoked(why.to_string()));
        }
        self.node_credentials.retain(|_, hash| !hashes.contains(hash));
        Ok(hashes.len() as u32)
    }

    /// `ebb tenant token rotate|revoke NAME`: the tenant's tokens are all
    /// revoked, and with `issue` one new token is made. The admin token,
    /// though it acts for the default tenant, is not a tenant token.
    pub(super) fn tenant_tokens(
        &mut self,
        tenants: &Tenants,
        fx: &mut impl Effects,
        name: &str,
        issue: bool,
    ) -> Result<ebb_api::TenantTokens, Fail> {
        let id = tenants
            .names
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| Refusal::not_found(format!("tenant {name}: not found")))?;
        let why = format!(
            "this token of tenant {name} was {} by the operator",
            if issue { "replaced (rotated)" } else { "revoked" }
        );
        let ours =
            |p: &Principal| p.scope == Scope::Tenant && p.tenant.as_ref().is_some_and(|(t, _)| *t == id);
        let revoked = self.revoke(fx, ours, &why)?;
        let token =
            if issue { Some(self.grant(fx, Principal::tenant(Scope::Tenant, id, name))?) } else { None };
        tracing::info!(tenant = name, revoked, issued = issue, "tenant tokens changed by the operator");
        Ok(ebb_api::TenantTokens { tenant: name.to_string(), token, revoked })
    }

    /// A new join token, written to `join.token` (0600) before it is
    /// stored; the old one is refused from now. Nodes keep their own
    /// credentials.
    pub(super) fn rotate_join_token(
        &mut self,
        data_dir: &std::path::Path,
        fx: &mut impl Effects,
    ) -> Result<ebb_api::JoinToken, Fail> {
        let path = data_dir.join("join.token");
        let token = new_token();
        write_secret(&path, &token).map_err(|e| Refusal::internal(format!("{}: {e}", path.display())))?;
        let revoked = self.revoke(
            fx,
            |p| p.scope == Scope::Agent,
            "this join token was replaced (rotated) by the operator: use the new one in the server's join.token",
        )?;
        let hash = hash_token(&token);
        fx.put_token(&TokenRow { hash: hash.clone(), tenant: None, scope: Scope::Agent, node: None })?;
        self.tokens.write().expect("token map").insert(hash, TokenState::Valid(Principal::join()));
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
            Scope::Agent if self.node_credentials.contains_key(node) => Err(Refusal::forbidden(&format!(
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
        if self.node_credentials.contains_key(node) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_over_access_store_hashes_and_a_revoked_node_must_rejoin_with_the_join_token() {
        let mut owned = effects::Owned::new(JobId(1), 1_000);
        owned.tenants.names.insert(TenantId(1), "acme".into());
        let p = &mut owned.parts();
        // A node joining with the join token is issued its own credential.
        assert_eq!(p.access.may_register(&Principal::join(), "a"), Ok(true));
        let credential = p.access.grant(&mut p.fx, Principal::node("a")).unwrap();
        let (hash, row) = p.fx.tokens.last().unwrap();
        assert_eq!((hash, row.as_ref().unwrap().node.as_deref()), (&hash_token(&credential), Some("a")));
        assert_ne!(hash, &credential, "the store keeps the hash, never the token");
        // From then on only its credential registers it, and only it.
        let refused = p.access.may_register(&Principal::join(), "a").unwrap_err();
        assert!(refused.message.starts_with("node a: already has its own credential"), "{}", refused.message);
        assert_eq!(p.access.may_register(&Principal::node("a"), "a"), Ok(false));
        assert!(p.access.may_register(&Principal::node("a"), "b").is_err());
        // Revoked, it is refused at once, and the join token may register it again.
        let revoked = p.access.revoke(&mut p.fx, |who| who.node.as_deref() == Some("a"), "removed").unwrap();
        assert_eq!(revoked, 1);
        assert_eq!(p.fx.tokens.last(), Some(&(hash_token(&credential), None)));
        assert!(p.access.credential_valid("a").is_err());
        assert_eq!(p.access.may_register(&Principal::join(), "a"), Ok(true));
        let map = p.access.tokens.read().unwrap();
        assert!(matches!(&map[&hash_token(&credential)], TokenState::Revoked(why) if why == "removed"));
        drop(map);
        // A tenant's tokens rotated: the old refused, one new.
        let old = p.access.grant(&mut p.fx, Principal::tenant(Scope::Tenant, TenantId(1), "acme")).unwrap();
        let rotated = p.access.tenant_tokens(p.tenants, &mut p.fx, "acme", true).unwrap();
        assert_eq!((rotated.revoked, rotated.token.is_some()), (1, true));
        let map = p.access.tokens.read().unwrap();
        assert!(matches!(map[&hash_token(&old)], TokenState::Revoked(_)));
        assert!(matches!(map[&hash_token(rotated.token.as_ref().unwrap())], TokenState::Valid(_)));
        drop(map);
        let unknown = p.access.tenant_tokens(p.tenants, &mut p.fx, "nobody", true);
        assert!(matches!(unknown, Err(Fail::Refused(r)) if r.message == "tenant nobody: not found"));
    }
}
