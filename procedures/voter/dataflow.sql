-- The voter as an S-Store dataflow, for every atomic batch of votes:
--   votes_in --vote--> validated --leaderboard--> to_delete --delete_contestant--> deletions
-- The trending leaderboard is kept by an EE trigger on the window `trending`.
-- `vote` is FOR EACH ROW: a batch's votes run one at a time, in the batch's
-- order, each through the whole dataflow (leaderboard, and the deletion it may
-- trigger) before the next, all in the batch's one transaction; so the tables
-- do not depend on how votes are cut into batches. `{window}` and `{slide}` are
-- filled in by procedures/voter/app.py.

CREATE STREAM votes_in (vote_id BIGINT, phone_number BIGINT, contestant_number INTEGER) PARTITION BY (phone_number);
CREATE STREAM validated (vote_id BIGINT, phone_number BIGINT, state VARCHAR, contestant_number INTEGER);
CREATE STREAM rejected_votes (vote_id BIGINT, reason VARCHAR);
CREATE STREAM to_delete (contestant_number INTEGER);
CREATE STREAM deletions (contestant_number INTEGER, removed_votes BIGINT);
CREATE WINDOW trending ON validated ROWS {window} SLIDE {slide};

CREATE PROCEDURE vote ON STREAM votes_in FOR EACH ROW AS BEGIN
    -- one vote (FOR EACH ROW): rejected, or inserted, by the same two conditions
    INSERT INTO rejected_votes
        SELECT v.vote_id,
               CASE WHEN c.contestant_number IS NULL THEN 'no such contestant' ELSE 'vote limit reached' END
        FROM votes_in v
        LEFT JOIN contestants c ON c.contestant_number = v.contestant_number
        LEFT JOIN phone_votes p ON p.phone_number = v.phone_number
        WHERE c.contestant_number IS NULL
           OR coalesce(p.num_votes, 0) >= (SELECT max_votes FROM voter_config WHERE id = 1);
    INSERT INTO votes
        SELECT v.vote_id, v.phone_number, coalesce(a.state, 'XX'), v.contestant_number, $ts
        FROM votes_in v
        JOIN contestants c ON c.contestant_number = v.contestant_number
        LEFT JOIN phone_votes p ON p.phone_number = v.phone_number
        LEFT JOIN area_code_state a ON a.area_code = v.phone_number // 10000000
        WHERE coalesce(p.num_votes, 0) < (SELECT max_votes FROM voter_config WHERE id = 1);
    INSERT INTO phone_votes
        SELECT phone_number, count(*) FROM votes
        WHERE vote_id IN (SELECT vote_id FROM votes_in) GROUP BY phone_number
        ON CONFLICT DO UPDATE SET num_votes = phone_votes.num_votes + excluded.num_votes;
    INSERT INTO validated
        SELECT vote_id, phone_number, state, contestant_number FROM votes
        WHERE vote_id IN (SELECT vote_id FROM votes_in) ORDER BY vote_id;
END;

CREATE TRIGGER trending_board ON WINDOW trending AS BEGIN
    DELETE FROM leaderboard WHERE board = 'trending';
    INSERT INTO leaderboard
        SELECT 'trending', r, contestant_number, n FROM (
            SELECT t.contestant_number, count(*) AS n,
                   row_number() OVER (ORDER BY count(*) DESC, t.contestant_number) AS r
            FROM trending t JOIN contestants c ON c.contestant_number = t.contestant_number
            GROUP BY t.contestant_number
        ) WHERE r <= 3;
END;

CREATE PROCEDURE leaderboard ON STREAM validated AS BEGIN
    INSERT INTO contestant_votes
        SELECT contestant_number, count(*) FROM validated GROUP BY contestant_number
        ON CONFLICT DO UPDATE SET num_votes = contestant_votes.num_votes + excluded.num_votes;
    UPDATE vote_counter SET total = total + (SELECT count(*) FROM validated) WHERE id = 1;
    DELETE FROM leaderboard WHERE board IN ('top', 'bottom');
    INSERT INTO leaderboard
        SELECT 'top', r, contestant_number, n FROM (
            SELECT c.contestant_number, coalesce(v.num_votes, 0) AS n,
                   row_number() OVER (ORDER BY coalesce(v.num_votes, 0) DESC, c.contestant_number) AS r
            FROM contestants c LEFT JOIN contestant_votes v ON v.contestant_number = c.contestant_number
        ) WHERE r <= 3;
    INSERT INTO leaderboard
        SELECT 'bottom', r, contestant_number, n FROM (
            SELECT c.contestant_number, coalesce(v.num_votes, 0) AS n,
                   row_number() OVER (ORDER BY coalesce(v.num_votes, 0), c.contestant_number) AS r
            FROM contestants c LEFT JOIN contestant_votes v ON v.contestant_number = c.contestant_number
        ) WHERE r <= 3;
    INSERT INTO to_delete
        SELECT contestant_number FROM (
            SELECT c.contestant_number
            FROM contestants c LEFT JOIN contestant_votes v ON v.contestant_number = c.contestant_number
            ORDER BY coalesce(v.num_votes, 0), c.contestant_number
            LIMIT 1
        )
        WHERE (SELECT count(*) FROM contestants) > 1
          AND (SELECT total FROM vote_counter WHERE id = 1) // (SELECT delete_every FROM voter_config WHERE id = 1)
            > ((SELECT total FROM vote_counter WHERE id = 1) - (SELECT count(*) FROM validated))
              // (SELECT delete_every FROM voter_config WHERE id = 1);
END;

CREATE PROCEDURE delete_contestant ON STREAM to_delete AS BEGIN
    -- reads only the home partition's tally, so it emits once however many partitions hold votes
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
    DELETE FROM contestant_votes WHERE contestant_number IN (SELECT contestant_number FROM to_delete);
    DELETE FROM leaderboard WHERE contestant_number IN (SELECT contestant_number FROM to_delete);
    DELETE FROM contestants WHERE contestant_number IN (SELECT contestant_number FROM to_delete);
END;
