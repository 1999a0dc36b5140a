-- Whether the database holds snapfence's tables, of any version. A catalogue read.
SELECT to_regclass('leases') IS NOT NULL
