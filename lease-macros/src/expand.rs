//! Generation only: the guarded function, built from checked arguments and the parsed function.
//!
//! `async fn f(args) -> T { body }` becomes
//! `async fn f(args) -> Result<T, ::lease_core::GuardError> { <acquire, run body, release> }`.
//! The signature is rewritten in place, so rustdoc and rust-analyzer show the real one; the body
//! moves unchanged into an `async move` block that `lease_core::guarded` runs under the lease, so
//! `return` and `?` inside it keep their meaning. Every path in the output is absolute
//! (`::lease_core::…`, `::core::…`), so names in the user's crate cannot capture them; a crate
//! that re-exports lease-core gives its own path to it with `crate = "…"`, which then stands for
//! `::lease_core` everywhere in the output (see [`Krate`]).

use proc_macro2::{Delimiter, Group, Ident, Punct, Spacing, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, Attribute, Expr, ExprLit, Lit, LitInt, Meta, ReturnType, Type};

use crate::attr::{
    CratePath, Errors, GuardedFn, Kind, LeaseArgs, Millis, RawArgs, TargetArg, WaitArg,
};

/// The whole attribute: parse, check, generate. On any error the function is emitted unchanged
/// next to the errors, so the rest of the crate (and the IDE) still sees it.
pub(crate) fn lease_attribute(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse2::<GuardedFn>(item.clone()) {
        Ok(func) => func,
        Err(error) => {
            let error = error.into_compile_error();
            return quote!(#item #error);
        }
    };
    let mut func = func;
    let mut errors = Errors::default();
    let args = syn::parse2::<RawArgs>(args).and_then(|raw| LeaseArgs::from_raw(kind, raw));
    // Lease attributes stacked below this one are taken in here, so the function gets one
    // `Result<T, GuardError>` instead of one `Result` per attribute.
    let stacked = take_stacked(&mut func.attrs);
    let mut layers = Vec::new();
    for layer in std::iter::once(args).chain(stacked) {
        match layer {
            Ok(layer) => layers.push(layer),
            Err(error) => errors.push(error),
        }
    }
    if func.sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            func.sig.fn_token.span,
            format!(
                "{} can only guard an `async fn`: the lease is acquired and watched \
                 asynchronously; write `async fn`",
                kind.attribute()
            ),
        ));
    }
    let krate = match Krate::of(&layers) {
        Ok(krate) => krate,
        Err(error) => {
            errors.push(error);
            Krate(None)
        }
    };
    match errors.into_result() {
        Ok(()) => guarded_fn(&layers, &krate, func),
        Err(error) => {
            let error = error.into_compile_error();
            quote!(#item #error)
        }
    }
}

/// The path the output names lease-core by: `::lease_core`, or the `crate = "…"` given.
pub(crate) struct Krate<'a>(Option<&'a CratePath>);

impl<'a> Krate<'a> {
    /// The one path for the whole function: stacked attributes expand into one function (one
    /// `Result<T, GuardError>`), so a `crate` given on any of them applies to all, and two
    /// different ones are an error at the second.
    fn of(layers: &'a [LeaseArgs]) -> syn::Result<Krate<'a>> {
        let mut given: Option<&CratePath> = None;
        for krate in layers.iter().filter_map(|layer| layer.krate.as_ref()) {
            match given {
                None => given = Some(krate),
                Some(first) => {
                    let (first_path, path) =
                        (first.path.to_token_stream(), krate.path.to_token_stream());
                    if first_path.to_string() != path.to_string() {
                        return Err(syn::Error::new(
                            krate.lit.span(),
                            format!(
                                "stacked attributes take one path to lease-core, and this is not \
                                 the {:?} given above: give `crate` once, on any of them",
                                first.lit.value()
                            ),
                        ));
                    }
                }
            }
        }
        Ok(Krate(given))
    }

    /// `<lease-core>::rest` (`GuardError`, `__private::body`). The default `::lease_core::rest`
    /// takes `span`, as the tokens around it do. A path given is spanned, with `rest`, at its
    /// literal, so a path that does not lead to lease-core is an error there ("cannot find
    /// `GuardError` in `collections`"); the span only says where, the tokens resolve as the
    /// attribute's own do.
    fn path(&self, span: Span, rest: TokenStream) -> TokenStream {
        match self.0 {
            None => respan(quote!(::lease_core::#rest), span),
            Some(krate) => {
                let path = &krate.path;
                respan(quote!(#path::#rest), krate.lit.span())
            }
        }
    }
}

/// `tokens` with every span set to `span`.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut token| {
            if let TokenTree::Group(group) = &token {
                let mut respanned = Group::new(group.delimiter(), respan(group.stream(), span));
                respanned.set_span(span);
                token = TokenTree::Group(respanned);
            } else {
                token.set_span(span);
            }
            token
        })
        .collect()
}

/// Removes the `#[leader_only]` and `#[semaphore]` attributes (by the last segment of their
/// path, so `#[lease_core::semaphore]` and `#[my_facade::lease::semaphore]` too) from `attrs`
/// and reads their arguments, in order.
fn take_stacked(attrs: &mut Vec<Attribute>) -> Vec<syn::Result<LeaseArgs>> {
    let mut stacked = Vec::new();
    attrs.retain(|attr| {
        let kind = match attr.path().segments.last().map(|s| s.ident.to_string()) {
            Some(name) if name == "leader_only" => Kind::Leader,
            Some(name) if name == "semaphore" => Kind::Semaphore,
            _ => return true,
        };
        if !matches!(attr.style, AttrStyle::Outer) {
            return true;
        }
        let raw = match &attr.meta {
            Meta::List(list) => syn::parse2::<RawArgs>(list.tokens.clone()),
            Meta::Path(_) => syn::parse2::<RawArgs>(TokenStream::new()),
            Meta::NameValue(value) => Err(syn::Error::new(
                value.eq_token.span,
                format!(
                    "{} takes its arguments in parentheses, e.g. {}",
                    kind.attribute(),
                    kind.example()
                ),
            )),
        };
        stacked.push(raw.and_then(|raw| LeaseArgs::from_raw(kind, raw)));
        false
    });
    stacked
}

fn guarded_fn(layers: &[LeaseArgs], krate: &Krate<'_>, func: GuardedFn) -> TokenStream {
    let GuardedFn {
        attrs,
        vis,
        mut sig,
        block,
    } = func;
    let (outer_attrs, inner_attrs): (Vec<_>, Vec<_>) = attrs
        .into_iter()
        .partition(|attr| matches!(attr.style, AttrStyle::Outer));

    // The body's own type, with `impl Trait` left to inference: it is named again below, where
    // an opaque type cannot be written.
    let (output, output_span) = match &sig.output {
        ReturnType::Default => (quote!(()), sig.ident.span()),
        ReturnType::Type(_, ty) => (ty.to_token_stream(), ty.span()),
    };
    let body_output = match &sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) => {
            let mut ty = (**ty).clone();
            EraseImplTrait.visit_type_mut(&mut ty);
            ty.into_token_stream()
        }
    };
    let guard_error = krate.path(output_span, quote!(GuardError));
    sig.output = syn::parse_quote_spanned! {output_span=>
        -> ::core::result::Result<#output, #guard_error>
    };

    // Each layer's spec and backend are evaluated first, in order, before the body takes its
    // captures. Mixed-site hygiene: the user's body cannot see (or shadow) these locals.
    let mut locals = TokenStream::new();
    let lease_backend = Ident::new("__LeaseBackend", Span::mixed_site());
    if layers.iter().any(|layer| layer.backend.is_some()) {
        locals.extend(lease_backend_trait(&lease_backend, krate));
    }
    let mut guarded_calls = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let spec = spec(layer, krate);
        let spec_var = Ident::new(&format!("__lease_spec_{i}"), Span::mixed_site());
        locals.extend(quote!(let #spec_var = #spec;));
        let guarded: Box<dyn Fn(TokenStream) -> TokenStream> = match &layer.backend {
            None => {
                let guarded = krate.path(Span::call_site(), quote!(guarded_by_default));
                Box::new(move |work| quote!(#guarded(&#spec_var, #work)))
            }
            Some(backend) => {
                let backend_var = Ident::new(&format!("__lease_backend_{i}"), Span::mixed_site());
                let borrowed = borrow_at(backend);
                locals.extend(quote! {
                    // A borrow in a `let` lives to the end of the function, so `backend` may be
                    // a temporary (`self.backend.clone()`); the coercion checks its type.
                    let #backend_var: &dyn #lease_backend<_> = #borrowed;
                });
                let guarded = krate.path(Span::call_site(), quote!(guarded));
                Box::new(
                    move |work| quote!(#guarded(#backend_var.__lease_backend(), &#spec_var, #work)),
                )
            }
        };
        guarded_calls.push(guarded);
    }
    let body_fn = krate.path(block.span(), quote!(__private::body));
    let body = quote_spanned! {block.span()=>
        #body_fn::<#body_output, _>(async move #block)
    };
    let flatten = krate.path(Span::call_site(), quote!(__private::flatten));
    // The innermost lease runs the body; each outer one runs the next, and their outcomes fold
    // into one `Result<T, GuardError>`.
    let mut run = body;
    for (depth, guarded) in guarded_calls.iter().enumerate().rev() {
        let call = guarded(run);
        run = if depth + 1 == guarded_calls.len() {
            call
        } else {
            quote!(async { #flatten(#call.await) })
        };
    }
    quote! {
        #(#outer_attrs)*
        #vis #sig {
            #(#inner_attrs)*
            #locals
            #run.await
        }
    }
}

/// What `backend = …` may be: a value of a type that implements `lease_core::Backend` (which
/// includes `Arc<B>`, `Box<B>` and `Arc<dyn Backend>`), or a reference to one, to any depth
/// (`&Memory`, `&&Memory`, `&dyn Backend`). One way through for each, told apart by the `Depth`
/// parameter, so the compiler infers it; a value of any other type is an E0277 at the user's
/// expression with this trait's message, which says what was expected.
///
/// Declared inside each function that names a backend: a proc-macro crate exports only macros,
/// and a helper in `lease_core` resolved through method-call auto-deref (as the generated code
/// once called) fails with an E0599 about the helper's method instead.
/// `do_not_recommend` keeps the compiler from explaining the error through these impls.
fn lease_backend_trait(name: &Ident, krate: &Krate<'_>) -> TokenStream {
    let backend = krate.path(Span::call_site(), quote!(Backend));
    quote! {
        #[diagnostic::on_unimplemented(
            message = "`backend = …` must be a lease backend or a reference to one, and `{Self}` is neither",
            label = "expected a lease backend, found `{Self}`",
            note = "a lease backend is a value whose type implements `lease_core::Backend` (`Memory`, \
                    `Consul`, `Etcd`, `Amqp`, an `Arc` or `Box` of one, `Arc<dyn Backend>`), or a \
                    reference to one: `backend = &consul`, `backend = &self.backend`, \
                    `backend = self.backend.clone()`",
            note = "for a backend behind another smart pointer (a `LazyLock`, an `Rc`), write a \
                    reference to the backend itself: `backend = &*BACKEND`"
        )]
        trait #name<Depth> {
            fn __lease_backend(&self) -> &dyn #backend;
        }
        #[diagnostic::do_not_recommend]
        impl<B: #backend> #name<()> for B {
            fn __lease_backend(&self) -> &dyn #backend {
                self
            }
        }
        #[diagnostic::do_not_recommend]
        impl #name<()> for dyn #backend {
            fn __lease_backend(&self) -> &dyn #backend {
                self
            }
        }
        #[diagnostic::do_not_recommend]
        impl<B: ?::core::marker::Sized + #name<Depth>, Depth> #name<(Depth,)> for &B {
            fn __lease_backend(&self) -> &dyn #backend {
                (**self).__lease_backend()
            }
        }
    }
}

/// `&backend`, located so that the borrow's span is exactly the user's expression: an error
/// about its type (a backend of the wrong type) then points there, not at the attribute.
///
/// The `&` takes the span of the expression's first token and the expression's own tokens end
/// it. Parentheses, which an operand looser than `&` needs (`&(a + b)`), take one span on stable
/// Rust, so there the error points at the first token.
fn borrow_at(backend: &Expr) -> TokenStream {
    let first = backend
        .to_token_stream()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| token.span());
    let mut amp = Punct::new('&', Spacing::Alone);
    amp.set_span(first);
    let binds_tighter_than_borrow = matches!(
        backend,
        Expr::Path(_)
            | Expr::Lit(_)
            | Expr::Field(_)
            | Expr::MethodCall(_)
            | Expr::Call(_)
            | Expr::Index(_)
            | Expr::Macro(_)
            | Expr::Paren(_)
            | Expr::Reference(_)
            | Expr::Unary(_)
            | Expr::Try(_)
            | Expr::Await(_)
            | Expr::Tuple(_)
            | Expr::Array(_)
            | Expr::Struct(_)
            | Expr::Block(_)
    );
    if binds_tighter_than_borrow {
        quote!(#amp #backend)
    } else {
        let mut parenthesized = Group::new(Delimiter::Parenthesis, backend.to_token_stream());
        parenthesized.set_span(first);
        quote!(#amp #parenthesized)
    }
}

/// `<lease-core>::LeaseSpec::…(…)` with a setter per option given; each part spanned at the
/// user's token, so a type error points there.
fn spec(args: &LeaseArgs, krate: &Krate<'_>) -> TokenStream {
    let key = match &args.target {
        TargetArg::Leader { key } => key,
        TargetArg::Semaphore { name, .. } => name,
    };
    // A literal key is checked at compile time by lease-core's own key rule (a const fn), so the
    // rule is written once: a broken one fails the build at the literal, in the rule's words.
    let checked = match key {
        Expr::Lit(ExprLit {
            lit: Lit::Str(literal),
            ..
        }) => {
            let assert_key = krate.path(literal.span(), quote!(__private::assert_key));
            quote_spanned!(literal.span()=> { const _: () = #assert_key(#literal); })
        }
        _ => TokenStream::new(),
    };
    let mut spec = match &args.target {
        TargetArg::Leader { key } => {
            let leader = krate.path(key.span(), quote!(LeaseSpec::leader));
            quote_spanned!(key.span()=> #leader(#key))
        }
        TargetArg::Semaphore { name, limit } => {
            let semaphore = krate.path(name.span(), quote!(LeaseSpec::semaphore));
            quote_spanned!(name.span()=> #semaphore(#name, #limit))
        }
    };
    if !checked.is_empty() {
        spec = quote!({ #checked #spec });
    }
    if let Some(wait) = &args.wait {
        let wait = match wait {
            WaitArg::Forever => krate.path(Span::call_site(), quote!(Wait::Forever)),
            WaitArg::Never => krate.path(Span::call_site(), quote!(Wait::Never)),
            WaitArg::UpTo(up_to) => {
                let up_to = duration(up_to);
                let wait = krate.path(up_to.span(), quote!(Wait::UpTo));
                quote_spanned!(up_to.span()=> #wait(#up_to))
            }
        };
        spec.extend(quote!(.wait(#wait)));
    }
    if let Some(ttl) = &args.ttl {
        let ttl = duration(ttl);
        spec.extend(quote!(.ttl(#ttl)));
    }
    if let Some(lock_delay) = &args.lock_delay {
        let lock_delay = duration(lock_delay);
        spec.extend(quote!(.lock_delay(#lock_delay)));
    }
    if let Some(min_hold) = &args.min_hold {
        let min_hold = duration(min_hold);
        spec.extend(quote!(.min_hold(#min_hold)));
    }
    if let Some(max_run) = &args.max_run {
        let max_run = duration(max_run);
        spec.extend(quote!(.max_run(#max_run)));
    }
    spec
}

fn duration(millis: &Millis) -> TokenStream {
    let value = LitInt::new(&format!("{}u64", millis.millis), millis.span);
    quote_spanned!(millis.span=> ::core::time::Duration::from_millis(#value))
}

/// Replaces every `impl Trait` in a type with `_`.
struct EraseImplTrait;

impl VisitMut for EraseImplTrait {
    fn visit_type_mut(&mut self, ty: &mut Type) {
        if let Type::ImplTrait(impl_trait) = ty {
            let underscore = syn::Token![_](impl_trait.span());
            *ty = syn::parse_quote!(#underscore);
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every identifier in `tokens`, at any depth.
    fn idents(tokens: TokenStream, into: &mut Vec<String>) {
        for token in tokens {
            match token {
                TokenTree::Ident(ident) => into.push(ident.to_string()),
                TokenTree::Group(group) => idents(group.stream(), into),
                TokenTree::Punct(_) | TokenTree::Literal(_) => {}
            }
        }
    }

    fn expand(kind: Kind, args: TokenStream, item: TokenStream) -> Vec<String> {
        let mut all = Vec::new();
        idents(lease_attribute(kind, args, item), &mut all);
        all
    }

    /// A function using every part of the expansion: a backend, a stacked attribute (with
    /// `stacked` among its arguments), and a body with an `impl Trait` output.
    fn stacked_fn(stacked: &TokenStream) -> TokenStream {
        quote! {
            #[semaphore("jobs/slots", 2, backend = backend, wait = "5s" #stacked)]
            async fn job(backend: &Memory) -> impl Display {
                1
            }
        }
    }

    #[test]
    fn without_crate_the_paths_are_lease_core() {
        let all = expand(
            Kind::Leader,
            quote!(key = "jobs/a", backend = backend, wait = "never"),
            stacked_fn(&TokenStream::new()),
        );
        assert!(all.iter().any(|ident| ident == "lease_core"), "{all:?}");
    }

    #[test]
    fn with_crate_no_path_is_lease_core() {
        for (top, stacked) in [
            (quote!(, crate = "facade::lease"), TokenStream::new()),
            (TokenStream::new(), quote!(, crate = "facade::lease")),
            (
                quote!(, crate = "facade::lease"),
                quote!(, crate = "facade::lease"),
            ),
        ] {
            let args = quote!(key = "jobs/a", backend = backend, wait = "never", ttl = "20s",
                lock_delay = "0s", min_hold = "1s", max_run = "1m" #top);
            let all = expand(Kind::Leader, args, stacked_fn(&stacked));
            assert!(
                !all.iter().any(|ident| ident == "lease_core"),
                "{top} / {stacked}: {all:?}"
            );
            assert!(all.iter().any(|ident| ident == "facade"), "{all:?}");
            // The stacked attribute was taken in, not left to expand on its own.
            assert_eq!(
                all.iter().filter(|ident| *ident == "flatten").count(),
                1,
                "{all:?}"
            );
        }
        let all = expand(
            Kind::Semaphore,
            quote!("reports", 3, crate = "renamed"),
            quote!(
                async fn report() {}
            ),
        );
        assert!(!all.iter().any(|ident| ident == "lease_core"), "{all:?}");
        assert!(all.iter().any(|ident| ident == "renamed"), "{all:?}");
    }

    #[test]
    fn stacked_attributes_with_two_paths_are_an_error() {
        let out = lease_attribute(
            Kind::Leader,
            quote!(key = "jobs/a", crate = "a::lease"),
            quote! {
                #[semaphore("jobs/slots", 2, crate = "b::lease")]
                async fn job() {}
            },
        )
        .to_string();
        assert!(out.contains("compile_error"), "{out}");
        assert!(
            out.contains("stacked attributes take one path to lease-core"),
            "{out}"
        );
    }
}
