//! The schema of the backend's tables: every statement is written for `lease` and renamed for
//! another.

/// The schema the backend's tables live in unless
/// [`PostgresBuilder::schema`](crate::PostgresBuilder::schema) says otherwise.
pub const DEFAULT_SCHEMA: &str = "lease";

/// `sql`, written for the schema `lease`, for `schema`.
pub(crate) fn in_schema(sql: &str, schema: &str) -> String {
    if schema == DEFAULT_SCHEMA {
        return sql.to_owned();
    }
    sql.replace(
        "SCHEMA IF NOT EXISTS lease;",
        &format!("SCHEMA IF NOT EXISTS {schema};"),
    )
    .replace("lease.", &format!("{schema}."))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The migration names its schema only as `lease.` prefixes and in its `CREATE SCHEMA`, so
    /// another schema's text names nothing of `lease`.
    #[test]
    fn another_schema_is_renamed_everywhere() {
        let sql = in_schema(crate::LEASE_SQL, "app_leases");
        assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS app_leases;"));
        assert!(sql.contains("app_leases.try_acquire("));
        let code: String = sql
            .lines()
            .filter(|line| !line.trim_start().starts_with("--"))
            .collect();
        assert!(!code.contains(" lease."), "{code}");
        assert!(!code.contains("(lease."), "{code}");
        assert!(!code.contains("'lease."), "{code}");
    }
}
