-- Accounting partitions (``[accounting] partitions``): each partition of the projection has its own position
-- row, named accounting-p<k>of<P> (the single projection, P = 1, keeps the name accounting). A row records
-- the P it was written under, so that a partition of another P starts where every partition of an earlier
-- P had got to (sql.lock_position): re-applying what lies past that is a no-op (every row's last_seq).
ALTER TABLE consumer_positions ADD COLUMN partitions integer NOT NULL DEFAULT 1;
