"""K-Lake operator: reconciles Tenant and Source custom resources into the database."""
