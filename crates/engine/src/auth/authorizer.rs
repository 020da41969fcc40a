//! Permission checks: resources, and the per-connection cache of decisions.

use super::{AuthData, PermissionSet};
use bytes::BytesMut;
use sluice_cql::ast::{Permission, Resource};
use sluice_protocol::{Compression, DbError, DetailedError, ErrorResponse};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// A resource as the authorizer names it: Cassandra's `data`, `data/ks`, `data/ks/t`,
/// `roles`, `roles/r`, with its display form for messages (`<table ks.t>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthResource {
    /// The stored name (`data/ks/t`).
    pub name: String,
    /// How messages name it (`<table ks.t>`).
    pub display: String,
    /// A hash of `name`, the cache's key.
    pub key: u64,
}

impl AuthResource {
    fn new(name: String, display: String) -> AuthResource {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        name.hash(&mut h);
        AuthResource {
            key: h.finish(),
            name,
            display,
        }
    }

    /// `ALL KEYSPACES`.
    pub fn all_keyspaces() -> AuthResource {
        AuthResource::new("data".into(), "<all keyspaces>".into())
    }

    /// `KEYSPACE ks`.
    pub fn keyspace(ks: &str) -> AuthResource {
        AuthResource::new(format!("data/{ks}"), format!("<keyspace {ks}>"))
    }

    /// `TABLE ks.t`.
    pub fn table(ks: &str, table: &str) -> AuthResource {
        AuthResource::new(
            format!("data/{ks}/{table}"),
            format!("<table {ks}.{table}>"),
        )
    }

    /// `ALL ROLES`.
    pub fn all_roles() -> AuthResource {
        AuthResource::new("roles".into(), "<all roles>".into())
    }

    /// `ROLE r`.
    pub fn role(r: &str) -> AuthResource {
        AuthResource::new(format!("roles/{r}"), format!("<role {r}>"))
    }

    /// The resource a statement names; a table without keyspace takes `session_ks`.
    pub fn from_ast(r: &Resource, session_ks: Option<&str>) -> Result<AuthResource, DetailedError> {
        Ok(match r {
            Resource::AllKeyspaces => AuthResource::all_keyspaces(),
            Resource::Keyspace(k) => AuthResource::keyspace(k),
            Resource::Table(q) => {
                let ks = q.keyspace.as_deref().or(session_ks).ok_or_else(|| {
                    DetailedError::new(
                        DbError::Invalid,
                        "No keyspace has been specified. USE a keyspace, or explicitly specify keyspace.tablename",
                    )
                })?;
                AuthResource::table(ks, &q.name)
            }
            Resource::AllRoles => AuthResource::all_roles(),
            Resource::Role(r) => AuthResource::role(r),
        })
    }

    /// The permissions that mean something on this resource, as Cassandra's
    /// `applicablePermissions` (no CREATE on a table; DESCRIBE only on all roles).
    pub fn applicable(&self) -> PermissionSet {
        use Permission::*;
        let depth = self.name.split('/').count();
        if self.name == "data" || (self.name.starts_with("data/") && depth == 2) {
            PermissionSet::of(&[Create, Alter, Drop, Select, Modify, Authorize])
        } else if self.name.starts_with("data/") {
            PermissionSet::of(&[Alter, Drop, Select, Modify, Authorize])
        } else if self.name == "roles" {
            PermissionSet::of(&[Create, Alter, Drop, Authorize, Describe])
        } else {
            PermissionSet::of(&[Alter, Drop, Authorize])
        }
    }
}

/// The resource and its parents, most specific first: `data/ks/t`, `data/ks`, `data`.
pub(crate) fn resource_chain(name: &str) -> impl Iterator<Item = &str> {
    let mut next = Some(name);
    std::iter::from_fn(move || {
        let cur = next?;
        next = cur.rfind('/').map(|i| &cur[..i]);
        Some(cur)
    })
}

/// True if `name` is `parent` or below it (`data/ks/t` is below `data/ks`).
pub(crate) fn is_same_or_child(name: &str, parent: &str) -> bool {
    name == parent
        || (name.len() > parent.len()
            && name.starts_with(parent)
            && name.as_bytes().get(parent.len()) == Some(&b'/'))
}

/// One permission a statement needs, decided once when it is analysed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessCheck {
    /// The permission.
    pub permission: Permission,
    /// On what.
    pub resource: Arc<AuthResource>,
}

/// A denied request: Unauthorized (0x2100) with a message naming the role, permission
/// and resource. The message is built once per cached decision and shared, so that
/// rejecting a request neither formats nor allocates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unauthorized {
    /// The permission that was missing.
    pub permission: Permission,
    /// Cassandra's message: `User alice has no SELECT permission on <table ks.t> or any
    /// of its parents`.
    pub message: Arc<str>,
}

/// The message of a request made before logging in (the server never lets one through;
/// this is the engine's own guard).
const NOT_LOGGED_IN: &str = "You have not logged in";

impl Unauthorized {
    /// The static-message rejection for a connection with no logged-in role.
    pub fn not_logged_in(permission: Permission) -> Unauthorized {
        Unauthorized {
            permission,
            message: Arc::from(NOT_LOGGED_IN),
        }
    }

    fn denied(role: &str, permission: Permission, resource: &AuthResource) -> Unauthorized {
        Unauthorized {
            permission,
            message: Arc::from(format!(
                "User {role} has no {} permission on {} or any of its parents",
                permission.as_str(),
                resource.display
            )),
        }
    }

    /// As an error value for the cold paths (allocates the message).
    pub fn to_detailed(&self) -> DetailedError {
        DetailedError::new(DbError::Unauthorized, self.message.to_string())
    }

    /// Appends the ERROR frame to `buf` without building any intermediate value.
    pub fn encode(&self, buf: &mut BytesMut, stream: i16, compression: Compression) {
        sluice_protocol::response::encode_error_text(
            buf,
            stream,
            &DbError::Unauthorized,
            &self.message,
            compression,
        );
    }

    /// The answer when a denial's own message is not at hand (the server keeps it per
    /// connection; this is its fallback).
    pub const GENERIC: ErrorResponse = ErrorResponse::new(
        DbError::Unauthorized,
        "The logged-in role lacks a permission this request needs",
    );
}

/// Decides from scratch: superusers may do anything; others need the permission on the
/// resource or a parent, held directly or through a granted role.
pub fn decide(
    data: &AuthData,
    role: &str,
    permission: Permission,
    resource: &AuthResource,
) -> Result<(), Unauthorized> {
    if data.is_superuser(role)
        || data
            .permissions_on(role, &resource.name)
            .contains(permission)
    {
        Ok(())
    } else {
        Err(Unauthorized::denied(role, permission, resource))
    }
}

/// How many decisions a connection keeps: statements of a connection touch few tables.
const CACHE_ENTRIES: usize = 32;

#[derive(Debug, Clone)]
struct CachedDecision {
    key: u64,
    permission: Permission,
    resource: Arc<AuthResource>,
    outcome: Result<(), Unauthorized>,
}

/// A connection's cache of permission decisions, valid for one generation of the auth
/// state: any role or grant change empties it on the next check.
#[derive(Debug, Clone, Default)]
pub struct PermissionCache {
    generation: u64,
    entries: Vec<CachedDecision>,
    next_victim: usize,
}

impl PermissionCache {
    /// The decision for `(permission, resource)` of `role`, from the cache when its
    /// generation is current; otherwise decided from `data()` and remembered.
    pub fn check(
        &mut self,
        generation: u64,
        role: &str,
        check: &AccessCheck,
        data: impl FnOnce() -> Arc<AuthData>,
    ) -> Result<(), Unauthorized> {
        if self.generation != generation {
            self.entries.clear();
            self.next_victim = 0;
            self.generation = generation;
        }
        let key = check.resource.key;
        for e in &self.entries {
            if e.key == key
                && e.permission == check.permission
                && (Arc::ptr_eq(&e.resource, &check.resource)
                    || e.resource.name == check.resource.name)
            {
                return e.outcome.clone();
            }
        }
        let outcome = decide(&data(), role, check.permission, &check.resource);
        let entry = CachedDecision {
            key,
            permission: check.permission,
            resource: check.resource.clone(),
            outcome: outcome.clone(),
        };
        if self.entries.len() < CACHE_ENTRIES {
            self.entries.push(entry);
        } else {
            // Round-robin replacement: bounded memory, no bookkeeping on hits.
            let i = self.next_victim % CACHE_ENTRIES;
            self.entries[i] = entry;
            self.next_victim = i + 1;
        }
        debug_assert!(self.entries.len() <= CACHE_ENTRIES);
        outcome
    }

    /// How many decisions are cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True if nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
