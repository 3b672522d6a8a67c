-- The job's QOS as the gateway resolved it at submit (--qos, else the partition's, else the default QOS);
-- '' for a job submitted before jobs carried a QOS (sacct prints it empty).

ALTER TABLE jobs ADD COLUMN qos text NOT NULL DEFAULT '';
