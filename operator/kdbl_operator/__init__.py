"""K-Lake operator: reconciles Tenant and Source custom resources into the database.

Modules: `main` (the `kdbl-operator` entry point: health endpoint, leader election, kopf), `handlers`
(thin kopf handlers), `desired` (pure: custom resource → desired rows, plans, status), `reconcile`
(one database transaction per reconcile, SQL in `db_sync`), `k8s` (the only module
calling the Kubernetes API), `election` (Lease-based leader election), `config` (settings).
The CRDs are in ../crds/ (the single source of truth), examples in ../examples/.
"""
