-- Job arrays: every task is a job row of its own (its own job_id); these columns say which array it
-- belongs to, so that sacct prints it as ARRAY_TASK (A_T) and "sacct -j A" finds every task.

ALTER TABLE jobs ADD COLUMN array_job_id bigint;     -- the array's id (its first task's job id); NULL: not a task
ALTER TABLE jobs ADD COLUMN array_task_id integer;   -- the task's index (SLURM_ARRAY_TASK_ID); NULL: not a task

CREATE INDEX jobs_array ON jobs (array_job_id, array_task_id) WHERE array_job_id IS NOT NULL;
