//! Scripting: `EVAL`, `EVALSHA` and `SCRIPT LOAD|EXISTS|FLUSH`. The interpreter itself is
//! `kv/script/`.

use super::prelude::*;
use crate::kv::script::{compile_check, run, sha1hex, Rules};
use crate::kv::types::MAX_SCRIPTS;

pub(super) const COMMANDS: &[CommandSpec] = &[
    CommandSpec::write("EVAL", -3, SCRIPTING, |ctx, a| eval(ctx, a, false)).keys(KeySpec::Script),
    CommandSpec::write("EVALSHA", -3, SCRIPTING, |ctx, a| eval(ctx, a, true)).keys(KeySpec::Script),
    // SCRIPT EXISTS only reads.
    CommandSpec::other(
        "SCRIPT",
        -2,
        SCRIPTING,
        Run::Mixed {
            reads: |a| a.first().is_some_and(|s| is(s, "EXISTS")),
            read: |ks, _, a| {
                Ok(Reply::Array(
                    a[1..]
                        .iter()
                        .map(|s| Reply::Int(ks.has_script(&String::from_utf8_lossy(s)) as i64))
                        .collect(),
                ))
            },
            write: script,
        },
    ),
];

/// `SCRIPT LOAD src` and `SCRIPT FLUSH [ASYNC|SYNC]`.
fn script(ctx: &mut Ctx<'_>, a: &[Bytes]) -> KvResult<Reply> {
    if ctx.in_script {
        return Err(KvError::NotFromScript);
    }
    match upper(&a[0]).as_str() {
        "LOAD" if a.len() == 2 => {
            let src = std::str::from_utf8(&a[1])
                .map_err(|_| KvError::invalid("script is not valid UTF-8"))?;
            let sha = sha1hex(src.as_bytes());
            compile_check(src)?;
            if !ctx.ks.scripts.contains_key(&sha) && ctx.ks.scripts.len() >= MAX_SCRIPTS {
                return Err(KvError::invalid(format!(
                    "script cache is full ({MAX_SCRIPTS} scripts)"
                )));
            }
            ctx.ks.scripts.insert(sha.clone(), src.to_owned());
            Ok(Reply::bulk(sha))
        }
        "FLUSH" if a.len() <= 2 => {
            ctx.ks.scripts.clear();
            ctx.ks.lua.clear();
            Ok(Reply::ok())
        }
        _ => Err(KvError::invalid(format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try SCRIPT HELP.",
            String::from_utf8_lossy(&a[0])
        ))),
    }
}

/// `EVAL src numkeys key… arg…` and `EVALSHA sha numkeys key… arg…`.
fn eval(ctx: &mut Ctx<'_>, a: &[Bytes], by_sha: bool) -> KvResult<Reply> {
    if ctx.in_script {
        return Err(KvError::NotFromScript);
    }
    let numkeys = parse_i64(&a[1])?;
    if numkeys < 0 {
        return Err(KvError::invalid("Number of keys can't be negative"));
    }
    if numkeys as usize > a.len() - 2 {
        return Err(KvError::invalid(
            "Number of keys can't be greater than number of args",
        ));
    }
    let keys = &a[2..2 + numkeys as usize];
    let args = &a[2 + numkeys as usize..];
    let (sha, src) = if by_sha {
        let sha = String::from_utf8_lossy(&a[0]).to_ascii_lowercase();
        match ctx.ks.scripts.get(&sha) {
            Some(src) => (sha, src.clone()),
            None => return Err(KvError::NoScript),
        }
    } else {
        let src = String::from_utf8(a[0].clone())
            .map_err(|_| KvError::invalid("script is not valid UTF-8"))?;
        let sha = sha1hex(src.as_bytes());
        // EVAL caches the script too (so EVALSHA works after it), up to the cache size.
        if !ctx.ks.scripts.contains_key(&sha) && ctx.ks.scripts.len() < MAX_SCRIPTS {
            ctx.ks.scripts.insert(sha.clone(), src.clone());
        }
        (sha, src)
    };
    let was = ctx.in_script;
    ctx.in_script = true;
    let vm = ctx.ks.lua.take(&sha, &src);
    let charged = ctx.semantics.charged_commands();
    let (reply, vm) = run(
        vm,
        &sha,
        &src,
        ctx.revision,
        Rules::of(ctx.semantics),
        keys,
        args,
        |cmd, pay| {
            // Under the charged-command rules the command's own work is paid first: past
            // the budget it does not run (the script stops `BUSY`).
            if charged && !pay(super::cost::charge(ctx, cmd)) {
                return Reply::Nil;
            }
            ctx.exec(cmd)
        },
    );
    if let Some(vm) = vm {
        ctx.ks.lua.put(&sha, vm);
    }
    ctx.in_script = was;
    Ok(reply)
}
