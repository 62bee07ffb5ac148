-- Voter with leaderboards (S-Store paper, section 4.1):
-- the tables and the set-up call, shared by both ways of running it
-- (dataflow.sql: server-side dataflow; client_ordered.sql: H-Store style).

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
CREATE TABLE leaderboard (
    board VARCHAR NOT NULL,            -- top | bottom | trending
    rank INTEGER NOT NULL,
    contestant_number INTEGER NOT NULL,
    num_votes BIGINT NOT NULL,
    PRIMARY KEY (board, rank)
);
CREATE TABLE vote_counter (id INTEGER PRIMARY KEY, total BIGINT NOT NULL);
CREATE TABLE voter_config (
    id INTEGER PRIMARY KEY,
    max_votes INTEGER NOT NULL,
    delete_every BIGINT NOT NULL,
    trending_window INTEGER NOT NULL
) REPLICATED;

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
END;

