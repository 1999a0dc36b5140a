-- Every body is bound (`w.body`): no upload.
upload AS (SELECT NULL::bytea AS body WHERE false),
