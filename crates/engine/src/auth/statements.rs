//! Role and permission statements (CREATE / ALTER / DROP / LIST ROLES, GRANT, REVOKE,
//! LIST PERMISSIONS), with Cassandra's rules on who may run them.

use super::authorizer::{decide, AccessCheck, AuthResource};
use super::password::is_bcrypt_hash;
use super::{AuthData, AuthState, PermissionSet, RoleRecord};
use crate::analyze::Plan;
use crate::catalog::invalid;
use crate::codec;
use crate::result::RowsBuilder;
use crate::{Engine, Session};
use sluice_cql::ast::{
    AlterRole, CreateRole, DropRole, ListPermissions, ListRoles, Permission, PermissionChange,
    RoleMembership, RoleOptions, Statement,
};
use sluice_protocol::{ColumnSpec, DbError, DetailedError, ResultMessage};
use sluice_types::{CqlType, NativeType};
use std::collections::BTreeSet;
use std::sync::Arc;

fn unauthorized(msg: impl Into<std::borrow::Cow<'static, str>>) -> DetailedError {
    DetailedError::new(DbError::Unauthorized, msg)
}

fn persist_failed() -> DetailedError {
    DetailedError::new(DbError::ServerError, "system_auth could not be persisted")
}

/// Keyspaces every role may read: drivers read them to connect and learn the schema.
fn readable_by_all(keyspace: &str) -> bool {
    matches!(
        keyspace,
        "system" | "system_schema" | "system_virtual_schema" | "system_views"
    )
}

/// The permissions a statement needs, decided when it is analysed. Role and permission
/// statements check their own rules when they run, so they need none here.
pub(crate) fn required_access(
    plan: &Plan,
    lwt: bool,
    session_ks: Option<&str>,
) -> Box<[AccessCheck]> {
    let check = |permission, resource: &Arc<AuthResource>| AccessCheck {
        permission,
        resource: resource.clone(),
    };
    let mut out = Vec::new();
    match plan {
        Plan::Select(s) => {
            if !readable_by_all(&s.table.keyspace) {
                let r = Arc::new(AuthResource::table(&s.table.keyspace, &s.table.name));
                out.push(check(Permission::Select, &r));
            }
        }
        Plan::Write(w) => {
            let r = Arc::new(AuthResource::table(&w.table.keyspace, &w.table.name));
            out.push(check(Permission::Modify, &r));
            if lwt {
                out.push(check(Permission::Select, &r));
            }
        }
        Plan::Batch(b) => {
            let mut seen: Vec<(&str, &str)> = Vec::new();
            for w in &b.writes {
                let key = (w.table.keyspace.as_str(), w.table.name.as_str());
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                let r = Arc::new(AuthResource::table(key.0, key.1));
                out.push(check(Permission::Modify, &r));
                if lwt {
                    out.push(check(Permission::Select, &r));
                }
            }
        }
        Plan::Transaction(t) => {
            let (read, written) = t.tables();
            let mut seen: Vec<(Permission, &str, &str)> = Vec::new();
            let wanted = read
                .iter()
                .filter(|t| !readable_by_all(&t.keyspace))
                .map(|t| (Permission::Select, t))
                .chain(written.iter().map(|t| (Permission::Modify, t)));
            for (permission, t) in wanted {
                let key = (permission, t.keyspace.as_str(), t.name.as_str());
                if seen.contains(&key) {
                    continue;
                }
                seen.push(key);
                let r = Arc::new(AuthResource::table(key.1, key.2));
                out.push(check(permission, &r));
            }
        }
        Plan::Dynamic(stmt) => {
            let table = |q: &sluice_cql::ast::QualifiedName| {
                q.keyspace
                    .as_deref()
                    .or(session_ks)
                    .map(|ks| Arc::new(AuthResource::table(ks, &q.name)))
            };
            let (permission, resource) = match &**stmt {
                Statement::CreateKeyspace(_) => (
                    Permission::Create,
                    Some(Arc::new(AuthResource::all_keyspaces())),
                ),
                Statement::AlterKeyspace(s) => (
                    Permission::Alter,
                    Some(Arc::new(AuthResource::keyspace(&s.name))),
                ),
                Statement::DropKeyspace(s) => (
                    Permission::Drop,
                    Some(Arc::new(AuthResource::keyspace(&s.name.name))),
                ),
                Statement::CreateTable(s) => (
                    Permission::Create,
                    s.name
                        .keyspace
                        .as_deref()
                        .or(session_ks)
                        .map(|ks| Arc::new(AuthResource::keyspace(ks))),
                ),
                Statement::AlterTable(s) => (Permission::Alter, table(&s.name)),
                Statement::DropTable(s) => (Permission::Drop, table(&s.name)),
                Statement::Truncate(q) => (Permission::Modify, table(q)),
                _ => return out.into_boxed_slice(),
            };
            if let Some(resource) = resource {
                out.push(AccessCheck {
                    permission,
                    resource,
                });
            }
        }
    }
    out.into_boxed_slice()
}

/// The logged-in role, or Cassandra's refusal of anonymous role management.
fn logged_in(session: &Session) -> Result<&str, DetailedError> {
    session.user.as_ref().map(|u| &*u.name).ok_or_else(|| {
        unauthorized("You have to be logged in and not anonymous to perform this request")
    })
}

/// `permission` on `resource`, or Unauthorized with Cassandra's message.
fn ensure(
    data: &AuthData,
    role: &str,
    permission: Permission,
    resource: &AuthResource,
) -> Result<(), DetailedError> {
    decide(data, role, permission, resource).map_err(|u| u.to_detailed())
}

fn role_missing(name: &str) -> DetailedError {
    invalid(format!("{name} doesn't exist"))
}

/// The hash a statement sets: `PASSWORD` hashed now, or `HASHED PASSWORD` as given.
async fn new_hash(auth: &AuthState, o: &RoleOptions) -> Result<Option<String>, DetailedError> {
    match (&o.password, &o.hashed_password) {
        (Some(_), Some(_)) => Err(invalid(
            "Options 'password' and 'hashed password' are mutually exclusive",
        )),
        (Some(p), None) => {
            if p.is_empty() {
                return Err(invalid("Password must not be empty"));
            }
            auth.hash(p.clone())
                .await
                .map(Some)
                .map_err(|_| DetailedError::new(DbError::ServerError, "password hashing failed"))
        }
        (None, Some(h)) => {
            if !is_bcrypt_hash(h) {
                return Err(invalid("Hashed password is not a valid bcrypt hash"));
            }
            Ok(Some(h.clone()))
        }
        (None, None) => Ok(None),
    }
}

fn check_options(o: &RoleOptions) -> Result<(), DetailedError> {
    if o.options.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(invalid(
            "Custom options are not supported by CassandraRoleManager",
        ));
    }
    Ok(())
}

/// Executes a role or permission statement.
pub(crate) async fn execute(
    engine: &Engine,
    session: &Session,
    stmt: &Statement,
) -> Result<ResultMessage, DetailedError> {
    match stmt {
        Statement::CreateRole(s) => create_role(engine, session, s).await,
        Statement::AlterRole(s) => alter_role(engine, session, s).await,
        Statement::DropRole(s) => drop_role(engine, session, s),
        Statement::ListRoles(s) => list_roles(engine, session, s),
        Statement::GrantPermissions(s) => change_permissions(engine, session, s, true),
        Statement::RevokePermissions(s) => change_permissions(engine, session, s, false),
        Statement::ListPermissions(s) => list_permissions(engine, session, s),
        Statement::GrantRole(s) => change_membership(engine, session, s, true),
        Statement::RevokeRole(s) => change_membership(engine, session, s, false),
        _ => Err(invalid("Unsupported statement")),
    }
}

async fn create_role(
    engine: &Engine,
    session: &Session,
    s: &CreateRole,
) -> Result<ResultMessage, DetailedError> {
    let auth = &engine.auth;
    let me = logged_in(session)?;
    let data = auth.data();
    if s.options.superuser == Some(true) && !data.is_superuser(me) {
        return Err(unauthorized(
            "Only superusers can create a role with superuser status",
        ));
    }
    ensure(&data, me, Permission::Create, &AuthResource::all_roles())?;
    if s.name.is_empty() {
        return Err(invalid("Role name can't be an empty string"));
    }
    check_options(&s.options)?;
    if data.roles.contains_key(&s.name) {
        if s.if_not_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(invalid(format!("{} already exists", s.name)));
    }
    let salted_hash = new_hash(auth, &s.options).await?;
    let record = RoleRecord {
        can_login: s.options.login.unwrap_or(s.user_syntax),
        is_superuser: s.options.superuser.unwrap_or(false),
        member_of: BTreeSet::new(),
        salted_hash,
    };
    let creator_grants = auth.checks_permissions();
    let resource = AuthResource::role(&s.name);
    let created = auth.update(
        &engine.storage,
        |d| {
            // Checked again under the lock: a concurrent CREATE may have won.
            if d.roles.contains_key(&s.name) {
                return Ok(false);
            }
            d.roles.insert(s.name.clone(), record);
            if creator_grants {
                grant_to_creator(d, me, &resource);
            }
            Ok(true)
        },
        persist_failed,
    )?;
    if !created && !s.if_not_exists {
        return Err(invalid(format!("{} already exists", s.name)));
    }
    audit(session, "CREATE ROLE", &s.name);
    Ok(ResultMessage::Void)
}

/// The creator of a resource gets every permission that applies to it, as in Cassandra.
fn grant_to_creator(d: &mut AuthData, creator: &str, resource: &AuthResource) {
    let grants = d.permissions.entry(creator.to_string()).or_default();
    let set = grants.entry(resource.name.clone()).or_default();
    *set = set.union(resource.applicable());
}

async fn alter_role(
    engine: &Engine,
    session: &Session,
    s: &AlterRole,
) -> Result<ResultMessage, DetailedError> {
    let auth = &engine.auth;
    let me = logged_in(session)?;
    let data = auth.data();
    let Some(target) = data.roles.get(&s.name) else {
        if s.if_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(role_missing(&s.name));
    };
    check_options(&s.options)?;
    let i_am_super = data.is_superuser(me);
    if s.options.superuser.is_some() {
        if s.name == me {
            return Err(unauthorized(
                "You aren't allowed to alter your own superuser status or that of a role granted to you",
            ));
        }
        if !i_am_super {
            return Err(unauthorized(
                "Only superusers are allowed to alter superuser status",
            ));
        }
    }
    let only_own_password = s.name == me
        && s.options.superuser.is_none()
        && s.options.login.is_none()
        && s.options.options.is_none();
    if !only_own_password {
        if target.is_superuser && !i_am_super {
            return Err(unauthorized(
                "Only superusers are allowed to alter a role with superuser status",
            ));
        }
        ensure(&data, me, Permission::Alter, &AuthResource::role(&s.name))?;
    }
    let salted_hash = new_hash(auth, &s.options).await?;
    auth.update(
        &engine.storage,
        |d| {
            let Some(r) = d.roles.get_mut(&s.name) else {
                return Err(role_missing(&s.name));
            };
            if let Some(h) = salted_hash {
                r.salted_hash = Some(h);
            }
            if let Some(l) = s.options.login {
                r.can_login = l;
            }
            if let Some(su) = s.options.superuser {
                r.is_superuser = su;
            }
            Ok(())
        },
        persist_failed,
    )?;
    audit(session, "ALTER ROLE", &s.name);
    Ok(ResultMessage::Void)
}

fn drop_role(
    engine: &Engine,
    session: &Session,
    s: &DropRole,
) -> Result<ResultMessage, DetailedError> {
    let auth = &engine.auth;
    let me = logged_in(session)?;
    let data = auth.data();
    if s.name == me {
        return Err(invalid("Cannot DROP primary role for current login"));
    }
    let Some(target) = data.roles.get(&s.name) else {
        if s.if_exists {
            return Ok(ResultMessage::Void);
        }
        return Err(role_missing(&s.name));
    };
    if target.is_superuser && !data.is_superuser(me) {
        return Err(unauthorized(
            "Only superusers can drop a role with superuser status",
        ));
    }
    ensure(&data, me, Permission::Drop, &AuthResource::role(&s.name))?;
    let resource = AuthResource::role(&s.name);
    auth.update(
        &engine.storage,
        |d| {
            d.roles.remove(&s.name);
            for r in d.roles.values_mut() {
                r.member_of.remove(&s.name);
            }
            d.permissions.remove(&s.name);
            d.drop_resource(&resource.name);
            Ok(())
        },
        persist_failed,
    )?;
    audit(session, "DROP ROLE", &s.name);
    Ok(ResultMessage::Void)
}

fn spec(name: &str, ty: NativeType) -> ColumnSpec {
    ColumnSpec {
        keyspace: "system".into(),
        table: "roles".into(),
        name: name.into(),
        ty: CqlType::native(ty),
    }
}

fn rows(specs: Vec<ColumnSpec>, rows: Vec<Vec<Option<bytes::Bytes>>>) -> ResultMessage {
    let mut out = RowsBuilder::new(specs.len());
    for r in &rows {
        for c in r {
            out.cell(c.as_deref());
        }
    }
    ResultMessage::Rows(out.finish(specs.into(), None, false))
}

fn list_roles(
    engine: &Engine,
    session: &Session,
    s: &ListRoles,
) -> Result<ResultMessage, DetailedError> {
    let me = logged_in(session)?;
    let data = engine.auth.data();
    let may_describe = decide(&data, me, Permission::Describe, &AuthResource::all_roles()).is_ok();
    let names: Vec<&str> = match &s.of {
        Some(of) => {
            if !data.roles.contains_key(of) {
                return Err(role_missing(of));
            }
            if !may_describe && !data.closure(me).contains(&of.as_str()) {
                return Err(unauthorized(format!(
                    "You are not authorized to view roles granted to {of}"
                )));
            }
            if s.recursive {
                data.closure(of)
            } else {
                let mut v = vec![of.as_str()];
                if let Some(r) = data.roles.get(of) {
                    v.extend(r.member_of.iter().map(String::as_str));
                }
                v
            }
        }
        None if may_describe => data.roles.keys().map(String::as_str).collect(),
        None => data.closure(me),
    };
    let mut names: Vec<&str> = names
        .into_iter()
        .filter(|n| !s.users || data.roles.get(*n).is_some_and(|r| r.can_login))
        .collect();
    names.sort_unstable();
    names.dedup();
    let map_ty = CqlType::Map(
        Box::new(CqlType::native(NativeType::Text)),
        Box::new(CqlType::native(NativeType::Text)),
    );
    let specs = if s.users {
        vec![
            spec("name", NativeType::Text),
            spec("super", NativeType::Boolean),
            spec("datacenters", NativeType::Text),
        ]
    } else {
        let mut options = spec("options", NativeType::Text);
        options.ty = map_ty;
        vec![
            spec("role", NativeType::Text),
            spec("super", NativeType::Boolean),
            spec("login", NativeType::Boolean),
            options,
            spec("datacenters", NativeType::Text),
        ]
    };
    let out = names
        .iter()
        .filter_map(|n| data.roles.get(*n).map(|r| (n, r)))
        .map(|(n, r)| {
            let mut row = vec![Some(codec::text(n)), Some(codec::boolean(r.is_superuser))];
            if !s.users {
                row.push(Some(codec::boolean(r.can_login)));
                row.push(Some(codec::text_map(&Default::default())));
            }
            row.push(Some(codec::text("ALL")));
            row
        })
        .collect();
    Ok(rows(specs, out))
}

/// True if the resource a grant names exists.
fn resource_exists(engine: &Engine, data: &AuthData, r: &AuthResource) -> bool {
    let mut parts = r.name.split('/');
    let schema = engine.schema();
    match (parts.next(), parts.next(), parts.next()) {
        (Some("data"), None, _) | (Some("roles"), None, _) => true,
        (Some("data"), Some(ks), None) => schema.keyspaces.contains_key(ks),
        (Some("data"), Some(ks), Some(t)) => schema.table(ks, t).is_some(),
        (Some("roles"), Some(role), None) => data.roles.contains_key(role),
        _ => false,
    }
}

fn change_permissions(
    engine: &Engine,
    session: &Session,
    s: &PermissionChange,
    grant: bool,
) -> Result<ResultMessage, DetailedError> {
    let auth = &engine.auth;
    let verb = if grant { "GRANT" } else { "REVOKE" };
    if !auth.checks_permissions() {
        return Err(invalid(format!(
            "{verb} operation is not supported by AllowAllAuthorizer"
        )));
    }
    let me = logged_in(session)?;
    let data = auth.data();
    let resource = AuthResource::from_ast(&s.resource, session.keyspace.as_deref())?;
    if !data.roles.contains_key(&s.role) {
        return Err(invalid(format!("Role {} doesn't exist", s.role)));
    }
    if !resource_exists(engine, &data, &resource) {
        return Err(invalid(format!(
            "Resource {} doesn't exist",
            resource.display
        )));
    }
    let asked = PermissionSet::of(&s.permissions);
    let applicable = resource.applicable();
    let perms = if s.all {
        asked.intersect(applicable)
    } else {
        let unsupported = asked.minus(applicable);
        if let Some(p) = unsupported.iter().next() {
            return Err(invalid(format!(
                "Resource {} does not support the {} permission",
                resource.display,
                p.as_str()
            )));
        }
        asked
    };
    ensure(&data, me, Permission::Authorize, &resource)?;
    // Nobody hands out a permission they do not hold themselves.
    for p in perms.iter() {
        ensure(&data, me, p, &resource)?;
    }
    auth.update(
        &engine.storage,
        |d| {
            let grants = d.permissions.entry(s.role.clone()).or_default();
            let cur = grants.entry(resource.name.clone()).or_default();
            *cur = if grant {
                cur.union(perms)
            } else {
                cur.minus(perms)
            };
            if cur.is_empty() {
                grants.remove(&resource.name);
            }
            d.permissions.retain(|_, g| !g.is_empty());
            Ok(())
        },
        persist_failed,
    )?;
    audit(session, verb, &s.role);
    Ok(ResultMessage::Void)
}

fn list_permissions(
    engine: &Engine,
    session: &Session,
    s: &ListPermissions,
) -> Result<ResultMessage, DetailedError> {
    if !engine.auth.checks_permissions() {
        return Err(invalid(
            "LIST PERMISSIONS operation is not supported by AllowAllAuthorizer",
        ));
    }
    let me = logged_in(session)?;
    let data = engine.auth.data();
    let i_am_super = data.is_superuser(me);
    let roles: Vec<&str> = match &s.of {
        Some(of) => {
            if !data.roles.contains_key(of) {
                return Err(invalid(format!("{of} doesn't exist")));
            }
            if !i_am_super && !data.closure(me).contains(&of.as_str()) {
                return Err(unauthorized(format!(
                    "You are not authorized to view {of}'s permissions"
                )));
            }
            if s.recursive {
                data.closure(of)
            } else {
                vec![of.as_str()]
            }
        }
        None if i_am_super => data.permissions.keys().map(String::as_str).collect(),
        None => {
            return Err(unauthorized(
                "You are not authorized to view everyone's permissions",
            ))
        }
    };
    let resource = match &s.resource {
        Some(r) => Some(AuthResource::from_ast(r, session.keyspace.as_deref())?),
        None => None,
    };
    let wanted = PermissionSet::of(&s.permissions);
    let mut out: Vec<(String, String, String, Permission)> = Vec::new();
    for role in roles {
        let Some(grants) = data.permissions.get(role) else {
            continue;
        };
        for (res, set) in grants {
            let matches = match &resource {
                None => true,
                Some(r) if s.recursive => {
                    super::authorizer::resource_chain(&r.name).any(|c| c == res)
                }
                Some(r) => &r.name == res,
            };
            if !matches {
                continue;
            }
            for p in set.intersect(wanted).iter() {
                out.push((role.to_string(), role.to_string(), display_of(res), p));
            }
        }
    }
    out.sort();
    let specs = vec![
        spec("role", NativeType::Text),
        spec("username", NativeType::Text),
        spec("resource", NativeType::Text),
        spec("permission", NativeType::Text),
    ];
    let rows_out = out
        .iter()
        .map(|(r, u, res, p)| {
            vec![
                Some(codec::text(r)),
                Some(codec::text(u)),
                Some(codec::text(res)),
                Some(codec::text(p.as_str())),
            ]
        })
        .collect();
    Ok(rows(specs, rows_out))
}

/// The display form (`<table ks.t>`) of a stored resource name.
pub(crate) fn display_of(name: &str) -> String {
    let mut parts = name.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("data"), None, _) => AuthResource::all_keyspaces().display,
        (Some("data"), Some(ks), None) => AuthResource::keyspace(ks).display,
        (Some("data"), Some(ks), Some(t)) => AuthResource::table(ks, t).display,
        (Some("roles"), None, _) => AuthResource::all_roles().display,
        (Some("roles"), Some(r), _) => AuthResource::role(r).display,
        _ => name.to_string(),
    }
}

fn change_membership(
    engine: &Engine,
    session: &Session,
    s: &RoleMembership,
    grant: bool,
) -> Result<ResultMessage, DetailedError> {
    let auth = &engine.auth;
    let me = logged_in(session)?;
    let data = auth.data();
    for r in [&s.role, &s.grantee] {
        if !data.roles.contains_key(r) {
            return Err(role_missing(r));
        }
    }
    ensure(
        &data,
        me,
        Permission::Authorize,
        &AuthResource::role(&s.role),
    )?;
    if grant {
        if data.closure(&s.grantee).contains(&s.role.as_str()) {
            return Err(invalid(format!("{} is a member of {}", s.grantee, s.role)));
        }
        if data.closure(&s.role).contains(&s.grantee.as_str()) {
            return Err(invalid(format!("{} is a member of {}", s.role, s.grantee)));
        }
    } else if !data
        .roles
        .get(&s.grantee)
        .is_some_and(|r| r.member_of.contains(&s.role))
    {
        return Err(invalid(format!(
            "{} is not a member of {}",
            s.grantee, s.role
        )));
    }
    auth.update(
        &engine.storage,
        |d| {
            let Some(g) = d.roles.get_mut(&s.grantee) else {
                return Err(role_missing(&s.grantee));
            };
            if grant {
                g.member_of.insert(s.role.clone());
            } else {
                g.member_of.remove(&s.role);
            }
            Ok(())
        },
        persist_failed,
    )?;
    audit(
        session,
        if grant { "GRANT ROLE" } else { "REVOKE ROLE" },
        &s.grantee,
    );
    Ok(ResultMessage::Void)
}

/// Audit line of a role or permission change.
fn audit(session: &Session, what: &'static str, target: &str) {
    tracing::info!(
        target: "sluice::audit",
        by = session.user.as_ref().map_or("", |u| &*u.name),
        source = ?session.peer,
        what,
        role = target,
        "role or permission change"
    );
}

/// After CREATE KEYSPACE / TABLE by a logged-in role with the authorizer on, the creator
/// gets every permission on the new resource.
pub(crate) fn grant_creator_of(
    engine: &Engine,
    session: &Session,
    session_ks: Option<&str>,
    stmt: &Statement,
) {
    let auth = &engine.auth;
    let Some(user) = &session.user else {
        return;
    };
    if !auth.checks_permissions() {
        return;
    }
    let resource = match stmt {
        Statement::CreateKeyspace(s) => AuthResource::keyspace(&s.name),
        Statement::CreateTable(s) => {
            let Some(ks) = s.name.keyspace.as_deref().or(session_ks) else {
                return;
            };
            AuthResource::table(ks, &s.name.name)
        }
        _ => return,
    };
    let r = auth.update(
        &engine.storage,
        |d| {
            grant_to_creator(d, &user.name, &resource);
            Ok::<(), ()>(())
        },
        || (),
    );
    if r.is_err() {
        tracing::warn!(resource = %resource.name, "creator permissions could not be granted");
    }
}
