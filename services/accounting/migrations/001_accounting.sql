-- The accounting read model (slurmdbd analogue): one row per job, one per step, projected from the
-- event log by the accounting service. Times are Unix seconds (double precision, as in the events).
-- last_seq is the stream sequence of the newest event applied to a row: updates only move it forward,
-- which makes replaying the log onto existing rows a no-op.

CREATE TABLE jobs (
    job_id              bigint PRIMARY KEY,
    name                text NOT NULL,
    user_name           text NOT NULL,
    account             text NOT NULL,
    partition           text NOT NULL,
    state               text NOT NULL,              -- JobState
    cancel_requested_by text,                       -- a cancel was requested (voids a later allocation)
    cancelled_by        text,                       -- CANCELLED by <user>
    exit_code           integer NOT NULL DEFAULT 0,
    signal              integer NOT NULL DEFAULT 0,
    submit_time         double precision NOT NULL,
    start_time          double precision,           -- start of the current/last run
    end_time            double precision,
    time_limit_s        bigint,                     -- NULL: partition default / unlimited
    num_nodes           integer NOT NULL,
    num_cpus            bigint NOT NULL,
    num_gpus            bigint NOT NULL,
    node_list           text NOT NULL DEFAULT '',   -- compressed hostlist of the current/last run
    restart_count       integer NOT NULL DEFAULT 0,
    workdir             text NOT NULL,
    reason              text NOT NULL DEFAULT 'None',
    last_seq            bigint NOT NULL
);

CREATE INDEX jobs_user_name ON jobs (user_name, job_id);
CREATE INDEX jobs_account ON jobs (account, job_id);
CREATE INDEX jobs_state ON jobs (state, job_id);
CREATE INDEX jobs_submit_time ON jobs (submit_time);
CREATE INDEX jobs_start_time ON jobs (start_time);
CREATE INDEX jobs_end_time ON jobs (end_time);

CREATE TABLE steps (
    job_id      bigint NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    step        text NOT NULL,                  -- 'batch' or a step number
    attempt     integer NOT NULL,               -- the run the step belongs to
    name        text NOT NULL,
    state       text NOT NULL,
    exit_code   integer NOT NULL DEFAULT 0,
    signal      integer NOT NULL DEFAULT 0,
    start_time  double precision,
    end_time    double precision,
    node_list   text NOT NULL DEFAULT '',
    num_cpus    bigint NOT NULL,
    num_tasks   integer NOT NULL,
    num_gpus    bigint NOT NULL,
    last_seq    bigint NOT NULL,
    PRIMARY KEY (job_id, step)
);

-- Where each projection consumer is in the log, written in the same transaction as its rows.
CREATE TABLE consumer_positions (
    consumer    text PRIMARY KEY,
    last_seq    bigint NOT NULL DEFAULT 0
);

-- The highest scheduler leader epoch seen in an allocation (fencing, as in the scheduler's fold).
CREATE TABLE scheduler_epoch (
    singleton   boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch       bigint NOT NULL
);
INSERT INTO scheduler_epoch (singleton, epoch) VALUES (true, 0);
