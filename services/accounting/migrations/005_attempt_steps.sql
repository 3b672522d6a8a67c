-- Every attempt keeps its steps (sacct -D shows each requeued run's steps under that run, as Slurm's step
-- records belong to the job record they ran in): a step is (job, attempt, step), no longer (job, step).
ALTER TABLE steps DROP CONSTRAINT steps_pkey;
ALTER TABLE steps ADD PRIMARY KEY (job_id, attempt, step);

-- Rebuild from the log: rows projected before this migration lost the steps of earlier attempts (a new
-- allocation overwrote or dropped them). Emptied, with the position back at 0, they are behind the durable
-- consumer, so the service replays the whole log (AccountingService.rewind_if_behind), as after 004.
TRUNCATE jobs, steps, attempts, node_periods;
UPDATE consumer_positions SET last_seq = 0;
UPDATE scheduler_epoch SET epoch = 0;
