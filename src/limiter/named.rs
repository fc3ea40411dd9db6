//! Scopes named by the config: a route's scope tables (`login.ip`) and custom scopes on
//! request attributes (`user`, `login.user`).
//!
//! A named scope is a one-byte handle into a process-wide, append-only table, so a
//! `Scope` stays `Copy` and two bytes wide on the request path, and its name is a
//! `&'static str` for Redis keys, metric labels and 429 bodies. Interning the same name
//! again returns the same handle (a reload that keeps its scopes adds nothing); the table
//! holds at most [`MAX_NAMED`] names for the life of the process, which bounds the memory
//! kept and every metric label derived from it.

use std::sync::{Mutex, OnceLock};

/// Most distinct named scopes one process interns (across reloads).
pub const MAX_NAMED: usize = 255;

/// A named scope's handle (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Named(u8);

/// What a named scope counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Base {
    /// The client address (a route's `ip` table).
    Ip,
    /// The key id (a route's `key` table).
    Key,
    /// The tenant id (a route's `tenant` table).
    Tenant,
    /// One counter for all of the route's traffic (a route's `global` table).
    Global,
    /// A request attribute: the custom scope of this name (`[scopes.<name>]`).
    Custom(&'static str),
}

/// One entry of the table.
#[derive(Debug)]
pub struct NamedInfo {
    /// The full name: `<route>.<scope>` for a route's table, else the custom scope's name.
    pub name: &'static str,
    /// The route whose requests alone it counts, if any.
    pub route: Option<&'static str>,
    /// What it counts.
    pub base: Base,
}

/// The table is full (see [`MAX_NAMED`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("more than {MAX_NAMED} named scopes (route scope tables and custom scopes)")]
pub struct TooMany;

static TABLE: [OnceLock<NamedInfo>; MAX_NAMED] = [const { OnceLock::new() }; MAX_NAMED];
static WRITER: Mutex<()> = Mutex::new(());

// === impl Named ===

impl Named {
    /// The handle of the scope `name` counting `base` on `route`'s requests, added when
    /// new. Not for the request path (it takes a lock).
    ///
    /// # Errors
    /// The table is full.
    pub fn intern(route: Option<&str>, base: Base) -> Result<Named, TooMany> {
        let base_name = match base {
            Base::Ip => "ip",
            Base::Key => "key",
            Base::Tenant => "tenant",
            Base::Global => "global",
            Base::Custom(n) => n,
        };
        let name = match route {
            Some(r) => format!("{r}.{base_name}"),
            None => base_name.to_string(),
        };
        let _guard = WRITER.lock().unwrap_or_else(|e| e.into_inner());
        for (i, slot) in TABLE.iter().enumerate() {
            match slot.get() {
                Some(info) if info.name == name => return Ok(Named(i as u8)),
                Some(_) => {}
                None => {
                    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
                    let info = NamedInfo {
                        name: leak(name),
                        route: route.map(|r| leak(r.to_string())),
                        base,
                    };
                    // Only this writer fills slots, under the lock: the slot is empty.
                    let _ = slot.set(info);
                    return Ok(Named(i as u8));
                }
            }
        }
        Err(TooMany)
    }

    /// The custom scope `name` (`[scopes.<name>]`, `[limits.<name>]`).
    ///
    /// # Errors
    /// The table is full.
    pub fn custom(name: &str) -> Result<Named, TooMany> {
        let leaked = Named::lookup(name)
            .map(|n| n.info().name)
            .unwrap_or_else(|| Box::leak(name.to_string().into_boxed_str()));
        Named::intern(None, Base::Custom(leaked))
    }

    /// The handle of the scope named `name`, if interned.
    pub fn lookup(name: &str) -> Option<Named> {
        TABLE
            .iter()
            .map_while(OnceLock::get)
            .position(|info| info.name == name)
            .map(|i| Named(i as u8))
    }

    /// Its index in the table (below [`MAX_NAMED`]).
    pub fn index(self) -> u8 {
        self.0
    }

    /// Its entry.
    pub fn info(self) -> &'static NamedInfo {
        // Handles are only made by `intern` and `lookup`, after the slot was set.
        static EMPTY: NamedInfo = NamedInfo {
            name: "unknown",
            route: None,
            base: Base::Global,
        };
        TABLE[usize::from(self.0)].get().unwrap_or(&EMPTY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_twice_gives_one_handle() {
        let a = Named::intern(Some("t_login"), Base::Ip).unwrap();
        let b = Named::intern(Some("t_login"), Base::Ip).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.info().name, "t_login.ip");
        assert_eq!(a.info().route, Some("t_login"));
        let c = Named::intern(Some("t_login"), Base::Key).unwrap();
        assert_ne!(a, c);
        assert_eq!(Named::lookup("t_login.key"), Some(c));
        let u = Named::custom("t_user").unwrap();
        assert_eq!(u.info().base, Base::Custom("t_user"));
        assert_eq!(Named::custom("t_user").unwrap(), u);
        let ru = Named::intern(Some("t_login"), Base::Custom("t_user")).unwrap();
        assert_eq!(ru.info().name, "t_login.t_user");
        assert_eq!(Named::lookup("nope.nope"), None);
    }
}
