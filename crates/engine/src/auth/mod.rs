//! Roles, passwords and permissions, in the shape of Cassandra's `CassandraRoleManager`,
//! `PasswordAuthenticator` and `CassandraAuthorizer`.
//!
//! The whole `system_auth` state (roles, memberships, grants) is one small document behind
//! an `RwLock<Arc<_>>`, persisted in the storage metadata store as the schema is. Every
//! change bumps a generation number; connections cache their permission decisions under
//! it ([`PermissionCache`]), so a served request checks its permission with a few compares.

mod authorizer;
mod password;
mod statements;

pub use authorizer::{AccessCheck, AuthResource, PermissionCache, Unauthorized};
pub use password::{hash_password, verify_password, MIN_BCRYPT_COST};
pub use sluice_cql::ast::Permission;
pub(crate) use statements::{execute as execute_statement, grant_creator_of, required_access};

use crate::EngineOpenError;
use serde::{Deserialize, Serialize};

use sluice_protocol::ErrorCode;
use sluice_storage::Storage;
use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// The class name STARTUP is answered with when passwords are required (drivers check it).
pub const PASSWORD_AUTHENTICATOR: &str = "org.apache.cassandra.auth.PasswordAuthenticator";
/// The superuser created on first start, as in Cassandra.
pub const DEFAULT_SUPERUSER: &str = "cassandra";
/// The default superuser's password until someone changes it.
pub const DEFAULT_SUPERUSER_PASSWORD: &str = "cassandra";
/// Cassandra's default bcrypt cost (`auth_bcrypt_gensalt_log2_rounds`).
pub const DEFAULT_BCRYPT_COST: u32 = 10;
/// How many password hashes may be computed at once: they are deliberately slow, so more
/// would only take CPU from requests.
const CONCURRENT_HASHES: usize = 2;
/// How long a verified password is remembered, so that a driver opening its pool of
/// connections pays the slow hash once (Cassandra's `credentials_validity` default).
const CREDENTIALS_VALIDITY: Duration = Duration::from_secs(2);
/// Most verified logins remembered at once.
const CREDENTIALS_CACHE_ENTRIES: usize = 1024;
/// The metadata key the auth document is stored under.
const AUTH_META_KEY: &[u8] = b"auth/v1";

/// Who may connect: everyone, or roles with a password.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthenticatorKind {
    /// No credentials asked (`AllowAllAuthenticator`).
    #[default]
    AllowAll,
    /// SASL PLAIN against `system_auth.roles` (`PasswordAuthenticator`).
    Password,
}

/// Whether permissions are checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuthorizerKind {
    /// Everything is permitted (`AllowAllAuthorizer`).
    #[default]
    AllowAll,
    /// Grants in `system_auth.role_permissions` (`CassandraAuthorizer`).
    Cassandra,
}

/// Authentication and authorization settings of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthConfig {
    /// The authenticator.
    pub authenticator: AuthenticatorKind,
    /// The authorizer.
    pub authorizer: AuthorizerKind,
    /// bcrypt cost (log2 rounds) of new password hashes.
    pub bcrypt_cost: u32,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            authenticator: AuthenticatorKind::AllowAll,
            authorizer: AuthorizerKind::AllowAll,
            bcrypt_cost: DEFAULT_BCRYPT_COST,
        }
    }
}

/// A set of permissions as bits, one per [`Permission`] in [`Permission::ALL`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PermissionSet(u8);

impl PermissionSet {
    const fn bit(p: Permission) -> u8 {
        1 << (p as u8)
    }

    /// The set of these permissions.
    pub fn of(ps: &[Permission]) -> PermissionSet {
        PermissionSet(ps.iter().fold(0, |acc, p| acc | Self::bit(*p)))
    }

    /// True if `p` is in the set.
    pub const fn contains(self, p: Permission) -> bool {
        self.0 & Self::bit(p) != 0
    }

    /// True if the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The union.
    pub const fn union(self, o: PermissionSet) -> PermissionSet {
        PermissionSet(self.0 | o.0)
    }

    /// The permissions of `self` not in `o`.
    pub const fn minus(self, o: PermissionSet) -> PermissionSet {
        PermissionSet(self.0 & !o.0)
    }

    /// The intersection.
    pub const fn intersect(self, o: PermissionSet) -> PermissionSet {
        PermissionSet(self.0 & o.0)
    }

    /// The permissions in the set, in Cassandra's order.
    pub fn iter(self) -> impl Iterator<Item = Permission> {
        Permission::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }
}

/// One row of `system_auth.roles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleRecord {
    /// `LOGIN`.
    pub can_login: bool,
    /// `SUPERUSER`.
    pub is_superuser: bool,
    /// The roles granted to this one.
    pub member_of: BTreeSet<String>,
    /// bcrypt hash of the password, if it has one.
    pub salted_hash: Option<String>,
}

/// Everything in `system_auth`, persisted as one document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthData {
    /// Roles by name.
    pub roles: BTreeMap<String, RoleRecord>,
    /// Grants: role -> resource name (`data/ks/t`) -> permissions.
    pub permissions: BTreeMap<String, BTreeMap<String, PermissionSet>>,
}

impl AuthData {
    /// The role and every role granted to it, transitively (each once).
    pub fn closure(&self, role: &str) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let Some((name, _)) = self.roles.get_key_value(role) else {
            return out;
        };
        out.push(name);
        let mut i = 0;
        while let Some(&r) = out.get(i) {
            i += 1;
            if let Some(rec) = self.roles.get(r) {
                for m in &rec.member_of {
                    if !out.contains(&m.as_str()) {
                        out.push(m);
                    }
                }
            }
        }
        out
    }

    /// True if the role or any role granted to it is a superuser.
    pub fn is_superuser(&self, role: &str) -> bool {
        self.closure(role)
            .iter()
            .any(|r| self.roles.get(*r).is_some_and(|rec| rec.is_superuser))
    }

    /// The permissions `role` holds on `resource` itself or any of its parents, inherited
    /// ones included.
    pub fn permissions_on(&self, role: &str, resource: &str) -> PermissionSet {
        let mut set = PermissionSet::default();
        for r in self.closure(role) {
            let Some(grants) = self.permissions.get(r) else {
                continue;
            };
            for res in authorizer::resource_chain(resource) {
                if let Some(p) = grants.get(res) {
                    set = set.union(*p);
                }
            }
        }
        set
    }

    /// Removes every grant on `resource` and its children (after DROP KEYSPACE / TABLE /
    /// ROLE, as Cassandra does); true if anything changed.
    pub fn drop_resource(&mut self, resource: &str) -> bool {
        let mut changed = false;
        for grants in self.permissions.values_mut() {
            let before = grants.len();
            grants.retain(|k, _| !authorizer::is_same_or_child(k, resource));
            changed |= grants.len() != before;
        }
        self.permissions.retain(|_, g| !g.is_empty());
        changed
    }
}

/// A role that logged in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedUser {
    /// The role name.
    pub name: Arc<str>,
}

/// Why a login failed; the message is what the client sees with Bad_credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoginError {
    /// The code (Bad_credentials, or Server_error when storage failed).
    pub code: ErrorCode,
    /// Why, without the user name (attacker-controlled text stays out of replies).
    pub message: &'static str,
}

/// The message of a wrong user name or password (one message for both, so that a client
/// cannot tell which roles exist).
pub const BAD_CREDENTIALS: &str = "Provided username and/or password are incorrect";

impl LoginError {
    const BAD: LoginError = LoginError {
        code: ErrorCode::BadCredentials,
        message: BAD_CREDENTIALS,
    };
    const NO_LOGIN: LoginError = LoginError {
        code: ErrorCode::BadCredentials,
        message: "This role is not permitted to log in",
    };
    const INTERNAL: LoginError = LoginError {
        code: ErrorCode::ServerError,
        message: "Password verification failed",
    };
}

/// The engine's auth state.
pub struct AuthState {
    config: AuthConfig,
    data: RwLock<Arc<AuthData>>,
    generation: AtomicU64,
    write_lock: Mutex<()>,
    hashing: tokio::sync::Semaphore,
    /// A hash verified when the user does not exist, so that unknown users cost the same.
    decoy_hash: String,
    default_password_in_use: AtomicBool,
    /// Recently verified logins: role name to a keyed digest of the password, the auth
    /// generation it was verified at, and when it expires. Only a match skips the hash; a
    /// mismatch is checked the slow way, so the cache is no cheap way to guess.
    credentials: Mutex<HashMap<Arc<str>, VerifiedLogin>>,
    /// The per-process random key of those digests.
    credentials_key: RandomState,
    /// Passwords checked against their slow hash since start.
    password_checks: AtomicU64,
}

/// A password verified recently (see `AuthState::credentials`).
#[derive(Debug, Clone, Copy)]
struct VerifiedLogin {
    digest: u64,
    generation: u64,
    until: Instant,
}

impl std::fmt::Debug for AuthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthState")
            .field("config", &self.config)
            .finish()
    }
}

impl AuthState {
    /// Loads the auth document; with the password authenticator and no roles yet, creates
    /// the default superuser and warns while its default password is in use.
    pub(crate) fn open(
        storage: &Storage,
        config: AuthConfig,
    ) -> Result<AuthState, EngineOpenError> {
        let stored = storage
            .meta_scan(AUTH_META_KEY)
            .map_err(EngineOpenError::Storage)?;
        let mut data = match stored
            .into_iter()
            .find(|(k, _)| k.as_slice() == AUTH_META_KEY)
        {
            Some((_, v)) => serde_json::from_slice(&v)
                .map_err(|_| EngineOpenError::CorruptSchema("auth document does not decode"))?,
            None => AuthData::default(),
        };
        let cost = config.bcrypt_cost.max(MIN_BCRYPT_COST);
        let hash = |p: &str| {
            hash_password(p, cost)
                .map_err(|_| EngineOpenError::CorruptSchema("password hashing failed"))
        };
        let password_auth = config.authenticator == AuthenticatorKind::Password;
        if password_auth && data.roles.is_empty() {
            data.roles.insert(
                DEFAULT_SUPERUSER.to_string(),
                RoleRecord {
                    can_login: true,
                    is_superuser: true,
                    member_of: BTreeSet::new(),
                    salted_hash: Some(hash(DEFAULT_SUPERUSER_PASSWORD)?),
                },
            );
            persist(storage, &data)
                .map_err(|_| EngineOpenError::CorruptSchema("auth document not persisted"))?;
            tracing::info!(role = DEFAULT_SUPERUSER, "created the default superuser");
        }
        let default_in_use = password_auth
            && data
                .roles
                .get(DEFAULT_SUPERUSER)
                .and_then(|r| r.salted_hash.as_deref())
                .is_some_and(|h| verify_password(DEFAULT_SUPERUSER_PASSWORD, h));
        let state = AuthState {
            config,
            data: RwLock::new(Arc::new(data)),
            generation: AtomicU64::new(1),
            write_lock: Mutex::new(()),
            hashing: tokio::sync::Semaphore::new(CONCURRENT_HASHES),
            decoy_hash: if password_auth {
                hash("decoy")?
            } else {
                String::new()
            },
            default_password_in_use: AtomicBool::new(default_in_use),
            credentials: Mutex::new(HashMap::new()),
            credentials_key: RandomState::new(),
            password_checks: AtomicU64::new(0),
        };
        state.warn_default_password();
        Ok(state)
    }

    /// The settings.
    pub fn config(&self) -> AuthConfig {
        self.config
    }

    /// True when clients must log in.
    pub fn requires_login(&self) -> bool {
        self.config.authenticator == AuthenticatorKind::Password
    }

    /// True when permissions are checked.
    pub fn checks_permissions(&self) -> bool {
        self.config.authorizer == AuthorizerKind::Cassandra
    }

    /// The current auth document.
    pub fn data(&self) -> Arc<AuthData> {
        match self.data.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The generation number: changes whenever roles or grants change.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// True while the default superuser still has its default password.
    pub fn default_password_in_use(&self) -> bool {
        self.default_password_in_use.load(Ordering::Relaxed)
    }

    fn warn_default_password(&self) {
        if self.default_password_in_use() {
            tracing::warn!(
                role = DEFAULT_SUPERUSER,
                "the default superuser still has its default password: change it with \
                 ALTER ROLE cassandra WITH PASSWORD = '...' (or create another superuser \
                 and drop this one)"
            );
        }
    }

    /// Checks a SASL PLAIN login. The bcrypt work runs on the blocking pool, at most
    /// [`CONCURRENT_HASHES`] at once, so that it never holds a shard's event loop.
    pub async fn login(
        &self,
        user: &str,
        password: &[u8],
    ) -> Result<AuthenticatedUser, LoginError> {
        let data = self.data();
        let found = data.roles.get_key_value(user);
        let digest = self.credentials_key.hash_one((user, password));
        if let Some((name, rec)) = found {
            if rec.can_login && self.remembered(user, digest) {
                return Ok(AuthenticatedUser {
                    name: Arc::from(name.as_str()),
                });
            }
        }
        let (hash, known) = match found {
            Some((_, rec)) => match &rec.salted_hash {
                Some(h) => (h.clone(), true),
                None => (self.decoy_hash.clone(), false),
            },
            None => (self.decoy_hash.clone(), false),
        };
        let permit = self
            .hashing
            .acquire()
            .await
            .map_err(|_| LoginError::INTERNAL)?;
        let pw = password.to_vec();
        self.password_checks.fetch_add(1, Ordering::Relaxed);
        let ok = tokio::task::spawn_blocking(move || verify_password(&pw, &hash))
            .await
            .map_err(|_| LoginError::INTERNAL)?;
        drop(permit);
        let Some((name, rec)) = found.filter(|_| ok && known) else {
            return Err(LoginError::BAD);
        };
        if !rec.can_login {
            return Err(LoginError::NO_LOGIN);
        }
        if name == DEFAULT_SUPERUSER && password == DEFAULT_SUPERUSER_PASSWORD.as_bytes() {
            self.warn_default_password();
        }
        let name: Arc<str> = Arc::from(name.as_str());
        self.remember(name.clone(), digest);
        Ok(AuthenticatedUser { name })
    }

    /// Passwords checked against their slow hash since start (a remembered login is not).
    pub fn password_checks(&self) -> u64 {
        self.password_checks.load(Ordering::Relaxed)
    }

    /// True when `user` logged in with a password of this `digest` less than
    /// [`CREDENTIALS_VALIDITY`] ago, and no role or grant changed since.
    fn remembered(&self, user: &str, digest: u64) -> bool {
        let generation = self.generation();
        let cache = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        cache.get(user).is_some_and(|v| {
            v.digest == digest && v.generation == generation && Instant::now() < v.until
        })
    }

    /// Remembers a verified login; a full cache first forgets the expired ones, else all.
    fn remember(&self, user: Arc<str>, digest: u64) {
        let now = Instant::now();
        let entry = VerifiedLogin {
            digest,
            generation: self.generation(),
            until: now + CREDENTIALS_VALIDITY,
        };
        let mut cache = self.credentials.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CREDENTIALS_CACHE_ENTRIES && !cache.contains_key(&user) {
            cache.retain(|_, v| v.until > now);
            if cache.len() >= CREDENTIALS_CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(user, entry);
        debug_assert!(cache.len() <= CREDENTIALS_CACHE_ENTRIES);
    }

    /// Hashes a new password on the blocking pool (bounded like logins).
    pub(crate) async fn hash(&self, password: String) -> Result<String, ()> {
        let cost = self.config.bcrypt_cost.max(MIN_BCRYPT_COST);
        let _permit = self.hashing.acquire().await.map_err(|_| ())?;
        tokio::task::spawn_blocking(move || hash_password(&password, cost).map_err(|_| ()))
            .await
            .map_err(|_| ())?
    }

    /// Applies `change` to a copy of the document under the write lock, persists it and
    /// swaps it in; the generation moves so that cached decisions are recomputed.
    pub(crate) fn update<T, E>(
        &self,
        storage: &Storage,
        change: impl FnOnce(&mut AuthData) -> Result<T, E>,
        persist_error: impl FnOnce() -> E,
    ) -> Result<T, E> {
        let _guard = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = (*self.data()).clone();
        let out = change(&mut next)?;
        if persist(storage, &next).is_err() {
            return Err(persist_error());
        }
        let default_in_use = self.default_password_in_use()
            && next.roles.get(DEFAULT_SUPERUSER).map(|r| &r.salted_hash)
                == self
                    .data()
                    .roles
                    .get(DEFAULT_SUPERUSER)
                    .map(|r| &r.salted_hash);
        {
            let mut g = self.data.write().unwrap_or_else(|p| p.into_inner());
            *g = Arc::new(next);
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        if self.default_password_in_use() && !default_in_use {
            self.default_password_in_use.store(false, Ordering::Relaxed);
            tracing::info!(
                role = DEFAULT_SUPERUSER,
                "the default superuser password changed"
            );
        }
        Ok(out)
    }

    /// Removes grants on a dropped keyspace, table or role resource.
    pub(crate) fn drop_resource(&self, storage: &Storage, resource: &str) {
        if !self
            .data()
            .permissions
            .values()
            .any(|g| g.keys().any(|k| authorizer::is_same_or_child(k, resource)))
        {
            return;
        }
        let r = self.update(
            storage,
            |d| {
                d.drop_resource(resource);
                Ok::<(), ()>(())
            },
            || (),
        );
        if r.is_err() {
            tracing::warn!(
                resource,
                "grants on a dropped resource could not be removed"
            );
        }
    }
}

fn persist(storage: &Storage, data: &AuthData) -> Result<(), ()> {
    let json = serde_json::to_vec(data).map_err(|_| ())?;
    storage.meta_put(AUTH_META_KEY, &json).map_err(|_| ())
}

#[cfg(test)]
mod tests;
