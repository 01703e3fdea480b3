//! `#[test]` for pdinject's integration test binary (`tests/it`, run by
//! libtest-mimic, `harness = false`). `tests/it/main.rs` brings it in with
//! `#[macro_use] extern crate it_macros;`, which puts it before the built-in `#[test]`
//! for every module of the binary: a test is written as with the standard harness.
//!
//! The attribute keeps the function as written and registers it
//! (`inventory::submit!` of a `crate::harness::Test`): its name (`module::function`,
//! as libtest names it), the function, and whether `#[ignore]` is on it (that
//! attribute is taken off, it means nothing on a plain function). The function
//! returns `()` or `crate::harness::Outcome` (`Err(Skip)`: the test could not run
//! its oracle). See `tests/it/harness.rs` and docs/testing.md.
//!
//! No dependency: the function's name is the identifier after `fn`, and the
//! attributes are read token by token.

use proc_macro::{Delimiter, Group, Ident, Literal, Punct, Spacing, Span, TokenStream, TokenTree};

#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    if let Some(t) = args.into_iter().next() {
        return error(t.span(), "#[test] takes no arguments here");
    }
    let tokens: Vec<TokenTree> = item.into_iter().collect();
    let mut kept: Vec<TokenTree> = Vec::with_capacity(tokens.len());
    let mut ignored = false;
    let mut i = 0;
    // Outer attributes: `#` then a bracketed group (doc comments arrive as `#[doc = ..]`).
    while let (Some(TokenTree::Punct(p)), Some(TokenTree::Group(g))) =
        (tokens.get(i), tokens.get(i + 1))
    {
        if p.as_char() != '#' || g.delimiter() != Delimiter::Bracket {
            break;
        }
        match attribute_name(g).as_deref() {
            Some("ignore") => ignored = true,
            Some("should_panic") => {
                return error(
                    g.span(),
                    "#[should_panic] is not supported in tests/it: catch the panic in the test (std::panic::catch_unwind)",
                );
            }
            Some("test") => return error(g.span(), "#[test] twice"),
            _ => kept.extend([tokens[i].clone(), tokens[i + 1].clone()]),
        }
        i += 2;
    }
    let rest = &tokens[i..];
    let at = rest
        .iter()
        .position(|t| matches!(t, TokenTree::Ident(f) if f.to_string() == "fn"));
    let Some(TokenTree::Ident(name)) = at.and_then(|at| rest.get(at + 1)) else {
        return error(Span::call_site(), "#[test] goes on a function");
    };
    let name = name.clone();
    match at.and_then(|at| rest.get(at + 2)) {
        Some(TokenTree::Group(g))
            if g.delimiter() == Delimiter::Parenthesis && g.stream().is_empty() => {}
        _ => {
            return error(
                name.span(),
                "a test is `fn NAME()`: no generics, no arguments",
            );
        }
    }
    kept.extend(rest.iter().cloned());
    let mut out: TokenStream = kept.into_iter().collect();
    let registration = format!(
        "::inventory::submit! {{ crate::harness::Test {{ \
             module: ::core::module_path!(), \
             name: {name_str}, \
             run: || crate::harness::IntoOutcome::into_outcome({name}()), \
             ignored: {ignored}, \
         }} }}",
        name_str = Literal::string(&name.to_string()),
    );
    let registration: TokenStream = registration.parse().expect("registration tokens");
    out.extend(respan(registration, name.span()));
    out
}

/// The first identifier inside `#[...]`: `ignore` for `#[ignore]` and `#[ignore = ".."]`.
fn attribute_name(g: &Group) -> Option<String> {
    match g.stream().into_iter().next()? {
        TokenTree::Ident(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Gives the generated tokens the test name's span, so an error in them (a return
/// type that is neither `()` nor `Outcome`) points at the test.
fn respan(ts: TokenStream, span: Span) -> TokenStream {
    ts.into_iter()
        .map(|t| match t {
            TokenTree::Group(g) => {
                let mut n = Group::new(g.delimiter(), respan(g.stream(), span));
                n.set_span(span);
                TokenTree::Group(n)
            }
            TokenTree::Ident(i) => TokenTree::Ident(Ident::new(&i.to_string(), span)),
            TokenTree::Punct(p) => {
                let mut n = Punct::new(p.as_char(), p.spacing());
                n.set_span(span);
                TokenTree::Punct(n)
            }
            TokenTree::Literal(mut l) => {
                l.set_span(span);
                TokenTree::Literal(l)
            }
        })
        .collect()
}

/// `compile_error!(msg)` at `span`.
fn error(span: Span, msg: &str) -> TokenStream {
    let mut lit = Literal::string(msg);
    lit.set_span(span);
    let tokens = [
        TokenTree::Ident(Ident::new("compile_error", span)),
        TokenTree::Punct({
            let mut p = Punct::new('!', Spacing::Alone);
            p.set_span(span);
            p
        }),
        TokenTree::Group({
            let mut g = Group::new(
                Delimiter::Parenthesis,
                TokenStream::from(TokenTree::Literal(lit)),
            );
            g.set_span(span);
            g
        }),
    ];
    tokens.into_iter().collect()
}
