-- The voter as state procedures (TStream's three steps; README "State procedures and
-- the `opchain` executor"), for every atomic batch of votes:
--   votes_in --vote--> validated --leaderboard--> to_delete --delete_contestant--> deletions
-- `vote` and `leaderboard` are Python state procedures (procedures/voter/state.py):
-- they declare keyed reads and writes, so under `--executor opchain` the 1-vote
-- batches of a punctuation interval share one load and one write-back per table.
-- `delete_contestant` stays SQL: it touches every vote of a contestant, so it is a
-- barrier (the interval's state is written back before it runs); it runs only when
-- the vote counter reaches a multiple of `delete_every`, on the contestant that
-- `leaderboard` chose and sent on `to_delete` (every partition deletes that one).
-- `vote` is FOR EACH ROW: a batch's votes run one at a time, each through the whole
-- dataflow, so a deletion falls between the votes where the counter crossed.
--
-- Self-contained, not schema.sql + this file: state access needs one-column primary
-- keys, so the leaderboard lives in `boards` (one row per board, three slots) and
-- the trending window in the one-row `tally`; the other tables are schema.sql's.
-- The window's slide is filled in by procedures/voter/app.py (its size is the
-- setup call's `trending_window`).

CREATE TABLE contestants (
    contestant_number INTEGER PRIMARY KEY,
    contestant_name VARCHAR NOT NULL
) REPLICATED;
CREATE TABLE area_code_state (area_code INTEGER PRIMARY KEY, state VARCHAR NOT NULL) REPLICATED;
CREATE TABLE votes (
    vote_id BIGINT PRIMARY KEY,
    phone_number BIGINT NOT NULL,
    state VARCHAR NOT NULL,
    contestant_number INTEGER NOT NULL,
    created BIGINT NOT NULL            -- the batch id that took the vote
) PARTITION BY (phone_number);
CREATE TABLE phone_votes (phone_number BIGINT PRIMARY KEY, num_votes BIGINT NOT NULL) PARTITION BY (phone_number);
CREATE TABLE contestant_votes (contestant_number INTEGER PRIMARY KEY, num_votes BIGINT NOT NULL);
CREATE TABLE vote_counter (id INTEGER PRIMARY KEY, total BIGINT NOT NULL);
CREATE TABLE voter_config (
    id INTEGER PRIMARY KEY,
    max_votes INTEGER NOT NULL,
    delete_every BIGINT NOT NULL,
    trending_window INTEGER NOT NULL
) REPLICATED;
-- the leaderboard: board top | bottom | trending, slots 1..3 (NULL: empty slot, e.g. after a deletion)
CREATE TABLE boards (
    board VARCHAR PRIMARY KEY,
    c1 INTEGER, n1 BIGINT,
    c2 INTEGER, n2 BIGINT,
    c3 INTEGER, n3 BIGINT
);
-- what the leaderboard procedure needs of all contestants at once, in one row (id 1):
-- counts[c] = votes of contestant c (1..number of contestants), gone = deleted contestants,
-- recent = the trending window (last `window_size` accepted votes' contestants, oldest first),
-- staged = accepted votes waiting for the window's next slide
CREATE TABLE tally (
    id INTEGER PRIMARY KEY,
    counts BIGINT[] NOT NULL,
    gone INTEGER[] NOT NULL,
    recent INTEGER[] NOT NULL,
    staged INTEGER[] NOT NULL,
    window_size INTEGER NOT NULL,
    slide INTEGER NOT NULL
);

CREATE STREAM votes_in (vote_id BIGINT, phone_number BIGINT, contestant_number INTEGER) PARTITION BY (phone_number);
CREATE STREAM validated (vote_id BIGINT, phone_number BIGINT, state VARCHAR, contestant_number INTEGER);
CREATE STREAM rejected_votes (vote_id BIGINT, reason VARCHAR);
CREATE STREAM to_delete (contestant_number INTEGER);  -- the present contestant with the fewest votes
CREATE STREAM deletions (contestant_number INTEGER, removed_votes BIGINT);

CREATE PROCEDURE setup (num_contestants INTEGER, max_votes INTEGER, delete_every BIGINT, trending_window INTEGER) AS BEGIN
    INSERT INTO contestants
        SELECT i, 'Contestant ' || i FROM range(1, $num_contestants + 1) t(i);
    INSERT INTO area_code_state
        SELECT 200 + i, ['AL','AK','AZ','AR','CA','CO','CT','DE','FL','GA','HI','ID','IL','IN','IA','KS',
                         'KY','LA','ME','MD','MA','MI','MN','MS','MO','MT','NE','NV','NH','NJ','NM','NY',
                         'NC','ND','OH','OK','OR','PA','RI','SC','SD','TN','TX','UT','VT','VA','WA','WV',
                         'WI','WY'][i % 50 + 1]
        FROM range(300) t(i);
    INSERT INTO voter_config VALUES (1, $max_votes, $delete_every, $trending_window);
    INSERT INTO vote_counter VALUES (1, 0);
    INSERT INTO boards (board) VALUES ('top'), ('bottom'), ('trending');
    INSERT INTO tally
        SELECT 1, coalesce(list(0::BIGINT), []), [], [], [], $trending_window, {slide}
        FROM range($num_contestants);
END;

CREATE PROCEDURE vote ON STREAM votes_in FOR EACH ROW AS PYTHON 'voter.state:vote';
CREATE PROCEDURE leaderboard ON STREAM validated AS PYTHON 'voter.state:leaderboard';

CREATE PROCEDURE delete_contestant ON STREAM to_delete AS BEGIN
    INSERT INTO deletions
        SELECT d.contestant_number,
               coalesce((SELECT num_votes FROM contestant_votes v WHERE v.contestant_number = d.contestant_number), 0)
        FROM to_delete d;
    UPDATE phone_votes SET num_votes = phone_votes.num_votes - d.n
        FROM (SELECT phone_number, count(*) AS n FROM votes
              WHERE contestant_number IN (SELECT contestant_number FROM to_delete)
              GROUP BY phone_number) d
        WHERE phone_votes.phone_number = d.phone_number;
    DELETE FROM phone_votes WHERE num_votes = 0;
    DELETE FROM votes WHERE contestant_number IN (SELECT contestant_number FROM to_delete);
    UPDATE boards SET
        c1 = CASE WHEN c1 = d.c THEN NULL ELSE c1 END, n1 = CASE WHEN c1 = d.c THEN NULL ELSE n1 END,
        c2 = CASE WHEN c2 = d.c THEN NULL ELSE c2 END, n2 = CASE WHEN c2 = d.c THEN NULL ELSE n2 END,
        c3 = CASE WHEN c3 = d.c THEN NULL ELSE c3 END, n3 = CASE WHEN c3 = d.c THEN NULL ELSE n3 END
        FROM (SELECT contestant_number AS c FROM to_delete) d;
    UPDATE tally SET gone = list_append(gone, d.c)
        FROM (SELECT contestant_number AS c FROM to_delete) d
        WHERE tally.id = 1;
    DELETE FROM contestants WHERE contestant_number IN (SELECT contestant_number FROM to_delete);
    DELETE FROM contestant_votes WHERE contestant_number IN (SELECT contestant_number FROM to_delete);
END;
