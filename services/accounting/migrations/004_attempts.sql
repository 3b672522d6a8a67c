-- Every attempt of a job, the TRES it asked for, and the nodes' capacity over time (sacct -D, AllocTRES,
-- ReqTRES, sreport). The tables are then rebuilt from the log (at the end of this file).

-- What the job asked for (ReqTRES, ReqGRES); num_* keep what its latest run got.
ALTER TABLE jobs ADD COLUMN req_nodes integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN req_cpus bigint NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN req_gpus bigint NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN req_mem_mb bigint;                  -- NULL: the partition's default
ALTER TABLE jobs ADD COLUMN gpu_type text NOT NULL DEFAULT '';  -- a typed request (gpu:h100:2); '' = any
ALTER TABLE jobs ADD COLUMN alloc_mem_mb bigint NOT NULL DEFAULT 0;  -- memory of the latest run, all nodes

-- One row per run of a job (attempt = SLURM_RESTART_COUNT), from its allocation to its conclusion or
-- requeue. sacct shows the latest as the job's row; -D shows the earlier ones too. sreport sums them.
CREATE TABLE attempts (
    job_id      bigint NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    state       text NOT NULL,                   -- RUNNING, then the job's end or REQUEUED/NODE_FAIL/PREEMPTED
    partition   text NOT NULL,
    start_time  double precision NOT NULL,
    end_time    double precision,
    node_list   text NOT NULL,
    num_nodes   integer NOT NULL,
    num_cpus    bigint NOT NULL,
    num_gpus    bigint NOT NULL,
    mem_mb      bigint NOT NULL,
    exit_code   integer NOT NULL DEFAULT 0,
    signal      integer NOT NULL DEFAULT 0,
    reason      text NOT NULL DEFAULT 'None',
    last_seq    bigint NOT NULL,
    PRIMARY KEY (job_id, attempt)
);

CREATE INDEX attempts_start_time ON attempts (start_time);

-- A node's capacity and availability over time, one row per period in which neither changed (as the
-- scheduler's fold sees it): opened by the event that changed them (start_seq), closed by the next one.
-- sreport's Reported is the capacity of every period, Down that of the periods the node was unavailable.
CREATE TABLE node_periods (
    node        text NOT NULL,
    start_seq   bigint NOT NULL,
    start_time  double precision NOT NULL,
    end_time    double precision,                -- NULL: still so
    cpus        bigint NOT NULL,
    gpus        bigint NOT NULL,
    available   boolean NOT NULL,                -- false: down or drained
    last_seq    bigint NOT NULL,
    PRIMARY KEY (node, start_seq)
);

CREATE INDEX node_periods_start_time ON node_periods (start_time);

-- Rebuild from the log: rows projected before this migration have no attempts, requests or node periods, and
-- replaying onto them would change nothing (last_seq). Emptied, with the position back at 0, they are behind
-- the durable consumer, so the service replays the whole log (AccountingService.rewind_if_behind).
TRUNCATE jobs, steps, attempts, node_periods;
UPDATE consumer_positions SET last_seq = 0;
UPDATE scheduler_epoch SET epoch = 0;
